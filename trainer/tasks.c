/* tasks.c - the task table (task.h): the one place that knows which tasks
 * ps-train has. The first row is the default task. */
#include <string.h>

#include "task.h"

extern const ps_task ps_task_mnist;
extern const ps_task ps_task_cartpole;
extern const ps_task ps_task_lm;
extern const ps_task ps_task_fit;

static const ps_task *const g_tasks[] = {
    &ps_task_mnist,
    &ps_task_cartpole,
    &ps_task_lm,
    &ps_task_fit,
};
#define N_TASKS ((int)(sizeof g_tasks / sizeof g_tasks[0]))

const ps_task *ps_task_find(const char *name) {
    for (int i = 0; i < N_TASKS; i++)
        if (!strcmp(g_tasks[i]->name, name)) return g_tasks[i];
    return NULL;
}

const ps_task *ps_task_default(void) { return g_tasks[0]; }

int ps_task_count(void) { return N_TASKS; }

const ps_task *ps_task_at(int i) { return i >= 0 && i < N_TASKS ? g_tasks[i] : NULL; }
