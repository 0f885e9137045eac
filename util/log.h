/*
 * log: leveled, thread-safe logging to stderr or a file.
 *
 * The macros test the level before formatting anything. Each line is
 * written with one write(2): "2026-11-29T10:58:00.123Z kvstashd[pid] LEVEL text".
 * log_reopen (SIGUSR1) reopens the file for logrotate. Callers put context
 * into the text: connection id and peer, file path, the failing call and
 * strerror(errno), or, where a machine should read it, into fields (log_kv).
 *
 * Two line formats (log_set_format): text, as above, with fields appended as
 * key=value; json, one object a line: {"ts": "...", "level": "info",
 * "pid": N, "msg": "...", and each field as "key": value}. Either way a line
 * is at most LOG_LINE_MAX bytes (a longer message is cut, still valid JSON).
 */
#ifndef LOG_H
#define LOG_H

/* The levels, lowest first; config.h names them ("error" .. "debug"). */
enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

/* The line formats; config.h names them ("text", "json"). */
enum log_format { LOG_FORMAT_TEXT = 0, LOG_FORMAT_JSON };

/* One context field of a structured line: a string (str != NULL) or a number. */
struct log_field {
    const char *key;
    const char *str;
    long long num;
};

#define LOG_STR(k, v) ((struct log_field){.key = (k), .str = (v) != NULL ? (v) : ""})
#define LOG_NUM(k, v) ((struct log_field){.key = (k), .str = NULL, .num = (long long)(v)})

extern volatile int log_level_;

/* log_open: log to path (append; "" = stderr) at level. 0 or -errno (stderr kept). */
int log_open(const char *path, int level);

/* log_set_level: change the level (config reload). */
void log_set_level(int level);

/* log_set_format: text or json (enum log_format) from the next line on. */
void log_set_format(int format);

/* log_reopen: reopen the current file (SIGUSR1). 0 or -errno (old file kept). */
int log_reopen(void);

/* log_close: back to stderr. */
void log_close(void);

void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * log_fields: one line at level: msg (a plain string, not a format) and the
 * n fields, in order. Any thread; never allocates. Use the log_kv macro.
 */
void log_fields(int level, const char *msg, const struct log_field *f, int n);

/* log_kv(LOG_LEVEL_INFO, "connection open", LOG_NUM("conn", id), LOG_STR("peer", p)) */
#define log_kv(level, msg, ...)                                                                \
    do {                                                                                       \
        if (log_level_ >= (level)) {                                                           \
            const struct log_field log_f_[] = {__VA_ARGS__};                                   \
            log_fields((level), (msg), log_f_, (int)(sizeof(log_f_) / sizeof(log_f_[0])));     \
        }                                                                                      \
    } while (0)

#define log_error(...) do { if (log_level_ >= LOG_LEVEL_ERROR) log_write(LOG_LEVEL_ERROR, __VA_ARGS__); } while (0)
#define log_warn(...)  do { if (log_level_ >= LOG_LEVEL_WARN)  log_write(LOG_LEVEL_WARN, __VA_ARGS__); } while (0)
#define log_info(...)  do { if (log_level_ >= LOG_LEVEL_INFO)  log_write(LOG_LEVEL_INFO, __VA_ARGS__); } while (0)
#define log_debug(...) do { if (log_level_ >= LOG_LEVEL_DEBUG) log_write(LOG_LEVEL_DEBUG, __VA_ARGS__); } while (0)

#endif
