/*
 * test_ssd_clean: the clean-shutdown marker of the SSD index. A marker written after a
 * close vouches for exactly that data.mdb: it is taken (removed) at the next open and
 * matches; any byte changed, a cut or a growth, a marker that does not parse, or no
 * marker at all make the open check in full. Each test works in a fresh mkdtemp directory.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ssd_clean.h"

static char t_dir[64];

static void
t_init(void)
{
    strcpy(t_dir, "/tmp/kvclean.XXXXXX");
    cr_assert_not_null(mkdtemp(t_dir), "mkdtemp: %s", strerror(errno));
}

static void
t_rm(const char *name)
{
    char p[128];

    snprintf(p, sizeof(p), "%s/%s", t_dir, name);
    (void)unlink(p);
}

static void
t_fini(void)
{
    t_rm("data.mdb");
    t_rm(SSD_CLEAN_NAME);
    rmdir(t_dir);
}

TestSuite(ssd_clean, .init = t_init, .fini = t_fini, .timeout = 30);

/* t_write: write len bytes of a pattern at off of name (created if absent). */
static void
t_write(const char *name, off_t off, size_t len, int seed)
{
    char p[128];
    char *buf = malloc(len);
    int fd;

    cr_assert_not_null(buf);
    for (size_t i = 0; i < len; i++) {
        buf[i] = (char)(i * 31 + (size_t)seed);
    }
    snprintf(p, sizeof(p), "%s/%s", t_dir, name);
    fd = open(p, O_WRONLY | O_CREAT, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, buf, len, off), (ssize_t)len);
    close(fd);
    free(buf);
}

static int
t_exists(const char *name)
{
    char p[128];

    snprintf(p, sizeof(p), "%s/%s", t_dir, name);
    return access(p, F_OK) == 0;
}

Test(ssd_clean, a_marker_vouches_once_for_the_file_it_was_written_for)
{
    char why[256];

    t_write("data.mdb", 0, 3 << 20, 1);     /* not a multiple of the read size */
    cr_assert_eq(ssd_clean_mark(t_dir), 0);
    cr_assert(t_exists(SSD_CLEAN_NAME));
    cr_assert_eq(ssd_clean_take(t_dir, why, sizeof(why)), 1, "%s", why);
    cr_assert(!t_exists(SSD_CLEAN_NAME), "the open must remove the marker");
    /* taken: the next open (after a crash, say) finds none */
    cr_assert_eq(ssd_clean_take(t_dir, why, sizeof(why)), 0);
    cr_assert(strstr(why, "no clean-shutdown marker") != NULL, "%s", why);
}

Test(ssd_clean, one_changed_byte_a_cut_or_a_growth_is_seen)
{
    char why[256];
    char p[128];

    snprintf(p, sizeof(p), "%s/data.mdb", t_dir);
    t_write("data.mdb", 0, 1 << 20, 2);
    cr_assert_eq(ssd_clean_mark(t_dir), 0);
    t_write("data.mdb", 700000, 1, 9);      /* one byte, deep inside */
    cr_assert_eq(ssd_clean_take(t_dir, why, sizeof(why)), 0);
    cr_assert(strstr(why, "changed since the clean shutdown") != NULL, "%s", why);

    cr_assert_eq(ssd_clean_mark(t_dir), 0);
    cr_assert_eq(truncate(p, 4096 * 100), 0);
    cr_assert_eq(ssd_clean_take(t_dir, why, sizeof(why)), 0);

    cr_assert_eq(ssd_clean_mark(t_dir), 0);
    t_write("data.mdb", 4096 * 100, 4096, 3);
    cr_assert_eq(ssd_clean_take(t_dir, why, sizeof(why)), 0);
    cr_assert(!t_exists(SSD_CLEAN_NAME));
}

Test(ssd_clean, a_marker_that_does_not_parse_vouches_for_nothing)
{
    static const char *const bad[] = {
        "", "kvstash-clean 1\n", "kvstash-clean 2 size=4096 crc32c=00000000\n",
        "kvstash-clean 1 size=4096 crc32c=0\n", "kvstash-clean 1 size=+4096 crc32c=00000000\n",
        "kvstash-clean 1 size=4096 crc32c=00000000", "kvstash-clean 1 size=4096 crc32c=00000000\nx",
    };
    char why[256];

    t_write("data.mdb", 0, 4096, 4);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char p[128];
        FILE *f;

        snprintf(p, sizeof(p), "%s/%s", t_dir, SSD_CLEAN_NAME);
        f = fopen(p, "w");
        cr_assert_not_null(f);
        fputs(bad[i], f);
        fclose(f);
        cr_assert_eq(ssd_clean_take(t_dir, why, sizeof(why)), 0, "marker %zu", i);
        cr_assert(!t_exists(SSD_CLEAN_NAME));
    }
}
