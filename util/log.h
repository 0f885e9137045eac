/*
 * log: leveled, thread-safe logging to stderr or a file.
 *
 * The macros test the level before formatting anything. Each line is
 * written with one write(2): "2026-11-29T10:58:00.123Z kvstashd[pid] LEVEL text".
 * log_reopen (SIGUSR1) reopens the file for logrotate. Callers put context
 * into the text: connection id and peer, file path, the failing call and
 * strerror(errno).
 */
#ifndef LOG_H
#define LOG_H

/* The levels, lowest first; config.h names them ("error" .. "debug"). */
enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

extern volatile int log_level_;

/* log_open: log to path (append; "" = stderr) at level. 0 or -errno (stderr kept). */
int log_open(const char *path, int level);

/* log_set_level: change the level (config reload). */
void log_set_level(int level);

/* log_reopen: reopen the current file (SIGUSR1). 0 or -errno (old file kept). */
int log_reopen(void);

/* log_close: back to stderr. */
void log_close(void);

void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) do { if (log_level_ >= LOG_LEVEL_ERROR) log_write(LOG_LEVEL_ERROR, __VA_ARGS__); } while (0)
#define log_warn(...)  do { if (log_level_ >= LOG_LEVEL_WARN)  log_write(LOG_LEVEL_WARN, __VA_ARGS__); } while (0)
#define log_info(...)  do { if (log_level_ >= LOG_LEVEL_INFO)  log_write(LOG_LEVEL_INFO, __VA_ARGS__); } while (0)
#define log_debug(...) do { if (log_level_ >= LOG_LEVEL_DEBUG) log_write(LOG_LEVEL_DEBUG, __VA_ARGS__); } while (0)

#endif
