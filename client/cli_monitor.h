/*
 * cli_monitor: the kvstash CLI's operator commands: stats (grouped, human units, or --json /
 * --raw), top (a live view of rates and hit ratios) and bench (a quick put/get load). Each
 * takes a connected client and the command's own arguments (argv[0] is the command name) and
 * returns the CLI's exit status (kvstash_cli.c: 0 ok, 1 refused, 2 usage, 3 transport).
 * Everything goes through kvstash.h; they print to stdout and report errors on stderr.
 */
#ifndef CLI_MONITOR_H
#define CLI_MONITOR_H

struct kvstash;

int cli_stats(struct kvstash *c, int argc, char **argv);
int cli_top(struct kvstash *c, int argc, char **argv);
int cli_bench(struct kvstash *c, int argc, char **argv);

#endif
