/* Worlds of real daemons on loopback for the C client's tests
 * (test_daemon.c starts and stops them; test_daemon3.c uses them too). */
#ifndef CVD_WORLD_H
#define CVD_WORLD_H

#include <sys/types.h>

#include "../collectived.h"

#define JOB "ctest-job"
#define MAX_NODES 4

typedef struct world {
	int nodes, local, size;
	char dir[64];
	char cfg[128];
	char sock[MAX_NODES][128];
	char log[MAX_NODES][128];
	pid_t pid[MAX_NODES];
} world;

typedef void (*trainer_fn)(cvd_client *c, const world *w);

/* Start nodes daemons of local trainers each (0, or -1 after a failed
 * check), and stop them (by PID: SIGTERM, then SIGKILL). */
int world_start(world *w, const char *bin, int nodes, int local);
void world_stop(world *w);
/* Fork one trainer per world rank; each connects, runs fn and reports
 * its check counters, which are added to this process's. */
void run_trainers(const world *w, trainer_fn fn, const char *what, int timeout_s);

/* The tests of protocol version 3's collectives on world w. */
void run_v3_daemon_tests(const world *w);
/* The tests of protocol version 4's named calls on world w (test_daemon4.c;
 * skipped, saying so, against a daemon without named matching). */
void run_v4_daemon_tests(const world *w);

#endif
