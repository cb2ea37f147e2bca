/*
 * Kiln's init: a placeholder until the runtime issue lands.
 *
 * As PID 1 it mounts the API filesystems, says hello on the console and hands over to machined
 * (or waits forever when there is none, so the kernel does not panic). Run as anything but
 * PID 1 (a build's test step), it prints its banner and exits.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

static const char *const machined_paths[] = {"/sbin/machined", "/usr/sbin/machined"};

static void mount_api_filesystems(void)
{
    mkdir("/proc", 0555);
    mkdir("/sys", 0555);
    mkdir("/dev", 0755);
    mkdir("/run", 0755);
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
    mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("kiln-init %s\n", KILN_VERSION);
        return 0;
    }
    printf("kiln-init %s: starting\n", KILN_VERSION);
    if (getpid() != 1) {
        printf("kiln-init: not PID 1, nothing to do\n");
        return 0;
    }
    mount_api_filesystems();
    fflush(stdout);
    for (size_t i = 0; i < sizeof machined_paths / sizeof machined_paths[0]; i++) {
        char *const args[] = {(char *)machined_paths[i], NULL};
        execv(machined_paths[i], args);
        if (errno != ENOENT)
            fprintf(stderr, "kiln-init: exec %s: %s\n", machined_paths[i], strerror(errno));
    }
    fprintf(stderr, "kiln-init: no machined, sleeping\n");
    for (;;)
        pause();
}
