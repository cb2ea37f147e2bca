/*
 * kiln-init: the tiny init in Kiln's initramfs.
 *
 * It mounts the kernel filesystems, attaches /rootfs.sqsh to a loop device and
 * mounts it read-only, stacks any system-extension layers from /extensions/ over
 * it as a read-only overlay, switches root (freeing the initramfs) and execs
 * machined. Every failure prints one clear line on the console and reboots after
 * a delay: a machine never hangs silently.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define ROOTFS "/rootfs.sqsh"
#define EXTENSIONS "/extensions"
#define MODULES "/modules"
#define NEWROOT "/newroot"
#define LOWER "/run/kiln/rootfs"
#define LAYERS "/run/kiln/extensions"
#define MACHINED "/usr/sbin/machined"
#define MAX_LAYERS 64
#define REBOOT_DELAY 10

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

/* One console line, prefix included, in a single write(2), so a kernel message or another
 * process's line cannot land between the prefix and the message. */
static void say(const char *fmt, ...) {
    static const char prefix[] = "kiln-init: ";
    char line[512];
    size_t used = sizeof prefix - 1;
    memcpy(line, prefix, used);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + used, sizeof line - used - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    used += (size_t)n > sizeof line - used - 2 ? sizeof line - used - 2 : (size_t)n;
    line[used++] = '\n';
    int fd = open("/dev/console", O_WRONLY | O_NOCTTY);
    if (fd < 0) fd = 2;
    if (write(fd, line, used) < 0) {
        /* nowhere left to report to */
    }
    if (fd != 2) close(fd);
}

static void reboot_later(void) {
    sync();
    sleep(REBOOT_DELAY);
    reboot(RB_AUTOBOOT);
    for (;;) pause();
}

static void fatal(const char *what) {
    int err = errno;
    say("fatal: %s: %s; rebooting in %d s", what, strerror(err), REBOOT_DELAY);
    reboot_later();
}

/* A failure that errno does not describe (a damaged image). */
static void fatal_damaged(const char *file, const char *why) {
    say("fatal: %s is damaged (%s): rebuild or re-download the image; rebooting in %d s", file, why, REBOOT_DELAY);
    reboot_later();
}

static void mount_or_die(const char *src, const char *dst, const char *type, unsigned long flags, const char *data) {
    char what[256];
    mkdir(dst, 0755);
    if (mount(src, dst, type, flags, data) != 0) {
        snprintf(what, sizeof what, "mount %s on %s (%s)", src, dst, type);
        fatal(what);
    }
}

/* Attach a file to a free loop device, read-only; returns its open fd (the device path in `dev`).
 * The loop is auto-cleared when its last user goes, so the fd must stay open until it is mounted. */
static int attach_loop(const char *file, char *dev, size_t size) {
    char what[256];
    int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0) fatal("open /dev/loop-control");
    for (int attempt = 0; attempt < 8; attempt++) {
        int index = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (index < 0) fatal("no free loop device");
        snprintf(dev, size, "/dev/loop%d", index);
        int loop = open(dev, O_RDWR | O_CLOEXEC);
        if (loop < 0) {
            mknod(dev, S_IFBLK | 0600, makedev(7, index));
            loop = open(dev, O_RDWR | O_CLOEXEC);
        }
        if (loop < 0) fatal("open loop device");
        int backing = open(file, O_RDONLY | O_CLOEXEC);
        if (backing < 0) {
            snprintf(what, sizeof what, "open %s", file);
            fatal(what);
        }
        struct loop_config config;
        memset(&config, 0, sizeof config);
        config.fd = (unsigned)backing;
        config.info.lo_flags = LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR;
        strncpy((char *)config.info.lo_file_name, file, LO_NAME_SIZE - 1);
        int ok = ioctl(loop, LOOP_CONFIGURE, &config);
        if (ok != 0 && errno == EINVAL) { /* kernels before 5.8 */
            ok = ioctl(loop, LOOP_SET_FD, backing);
            if (ok == 0) ok = ioctl(loop, LOOP_SET_STATUS64, &config.info);
        }
        close(backing);
        if (ok == 0) {
            close(ctl);
            return loop;
        }
        close(loop);
        if (errno != EBUSY) {
            snprintf(what, sizeof what, "attach %s to %s", file, dev);
            fatal(what);
        }
    }
    fatal("every loop device was busy");
    return -1;
}

static uint64_t le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Check the squashfs superblock before mounting, so a damaged or truncated image is named
 * as such instead of surfacing as the kernel's bare EINVAL (or, worse, as I/O errors later). */
static void check_squashfs(const char *file) {
    unsigned char sb[96];
    char what[320];
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(what, sizeof what, "open %s", file);
        fatal(what);
    }
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 ? read(fd, sb, sizeof sb) : -1;
    close(fd);
    if (n != (ssize_t)sizeof sb) fatal_damaged(file, "shorter than a squashfs superblock");
    if (memcmp(sb, "hsqs", 4) != 0) fatal_damaged(file, "no squashfs magic");
    uint64_t block_size = le(sb + 12, 4), block_log = le(sb + 22, 2), major = le(sb + 28, 2);
    uint64_t bytes_used = le(sb + 40, 8);
    if (major != 4) fatal_damaged(file, "not squashfs version 4");
    if (block_log < 12 || block_log > 20 || block_size != (1ULL << block_log))
        fatal_damaged(file, "inconsistent block size");
    if (bytes_used > (uint64_t)st.st_size) {
        snprintf(what, sizeof what, "truncated: %llu of %llu bytes", (unsigned long long)st.st_size,
                 (unsigned long long)bytes_used);
        fatal_damaged(file, what);
    }
}

static void mount_squashfs(const char *file, const char *dst) {
    char dev[64], what[320];
    check_squashfs(file);
    int loop = attach_loop(file, dev, sizeof dev);
    mkdir(dst, 0755);
    if (mount(dev, dst, "squashfs", MS_RDONLY | MS_NODEV | MS_NOSUID, NULL) != 0) {
        snprintf(what, sizeof what, "mount %s (%s) on %s as squashfs (is it damaged?)", file, dev, dst);
        fatal(what);
    }
    close(loop);
}

static int by_name(const struct dirent **a, const struct dirent **b);

static int is_module(const struct dirent *entry) {
    size_t n = strlen(entry->d_name);
    return n > 3 && strcmp(entry->d_name + n - 3, ".ko") == 0;
}

/* Kernels that build loop, squashfs or overlay as modules can ship them in /modules (name order). */
static void load_modules(void) {
    struct dirent **names = NULL;
    int count = scandir(MODULES, &names, is_module, by_name);
    for (int i = 0; i < count; i++) {
        char path[320];
        snprintf(path, sizeof path, MODULES "/%s", names[i]->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || (syscall(SYS_finit_module, fd, "", 0) != 0 && errno != EEXIST)) fatal(path);
        close(fd);
        free(names[i]);
    }
    free(names);
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

static int is_layer(const struct dirent *entry) {
    size_t n = strlen(entry->d_name);
    return n > 5 && strcmp(entry->d_name + n - 5, ".sqsh") == 0;
}

/* Mount the rootfs, and extension layers over it; returns the number of layers. */
static int assemble_root(void) {
    struct dirent **names = NULL;
    int count = scandir(EXTENSIONS, &names, is_layer, by_name);
    if (count <= 0) {
        mount_squashfs(ROOTFS, NEWROOT);
        return 0;
    }
    if (count > MAX_LAYERS) {
        errno = E2BIG;
        fatal("too many extension layers");
    }
    mkdir("/run/kiln", 0755);
    mkdir(LAYERS, 0755);
    mount_squashfs(ROOTFS, LOWER);
    /* overlay: the first lowerdir is the top; later extensions win over earlier ones */
    static char lowers[MAX_LAYERS * 48 + 64];
    size_t used = 0;
    for (int i = count - 1; i >= 0; i--) {
        char file[320], dst[320];
        snprintf(file, sizeof file, EXTENSIONS "/%s", names[i]->d_name);
        snprintf(dst, sizeof dst, LAYERS "/%d", i);
        mount_squashfs(file, dst);
        say("extension layer %s", names[i]->d_name);
        used += (size_t)snprintf(lowers + used, sizeof lowers - used, "%s:", dst);
        free(names[i]);
    }
    free(names);
    snprintf(lowers + used, sizeof lowers - used, "%s", LOWER);
    char options[sizeof lowers + 16];
    snprintf(options, sizeof options, "lowerdir=%s", lowers);
    mount_or_die("overlay", NEWROOT, "overlay", MS_RDONLY | MS_NODEV | MS_NOSUID, options);
    return count;
}

/* Read a file of the new root through once. squashfs has no checksums, but a damaged block
 * fails to decompress: caught here, it is one clear line instead of machined dying of SIGBUS
 * (a kernel panic). The pages read stay cached for the exec that follows, so this costs little. */
static void verify_readable(const char *path) {
    static char buf[65536];
    char what[320];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(what, sizeof what, "open %s", path);
        fatal(what);
    }
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
    }
    if (n < 0) {
        snprintf(what, sizeof what, "reading %s: %s", path, strerror(errno));
        fatal_damaged(ROOTFS, what);
    }
    close(fd);
}

/* Remove the initramfs's files (not crossing into other mounts) so its memory is freed. */
static void free_initramfs(const char *path, dev_t root_dev) {
    DIR *dir = opendir(path);
    if (!dir) return;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (!strcmp(entry->d_name, ".") || !strcmp(entry->d_name, "..")) continue;
        char child[512];
        snprintf(child, sizeof child, "%s/%s", strcmp(path, "/") ? path : "", entry->d_name);
        struct stat st;
        if (lstat(child, &st) != 0 || st.st_dev != root_dev) continue;
        if (S_ISDIR(st.st_mode)) {
            free_initramfs(child, root_dev);
            rmdir(child);
        } else {
            unlink(child);
        }
    }
    closedir(dir);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("kiln-init %s\n", KILN_VERSION);
        return 0;
    }
    if (getpid() != 1) { /* a build's test step, or a curious user: touch nothing */
        printf("kiln-init %s: not PID 1, nothing to do\n", KILN_VERSION);
        return 0;
    }
    say("version %s starting", KILN_VERSION);
    mount_or_die("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
    mount_or_die("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount_or_die("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount_or_die("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
    mkdir(NEWROOT, 0755);
    load_modules();

    int layers = assemble_root();
    say("rootfs mounted read-only with %d extension layer(s)", layers);

    struct stat initramfs;
    if (stat("/", &initramfs) != 0) fatal("stat /");
    static const char *moved[] = {"/dev", "/proc", "/sys", "/run"};
    for (size_t i = 0; i < sizeof moved / sizeof moved[0]; i++) {
        char dst[64];
        snprintf(dst, sizeof dst, NEWROOT "%s", moved[i]);
        if (mount(moved[i], dst, NULL, MS_MOVE, NULL) != 0) fatal(dst);
    }
    if (chdir(NEWROOT) != 0) fatal("chdir " NEWROOT);
    free_initramfs("/", initramfs.st_dev);
    if (mount(".", "/", NULL, MS_MOVE, NULL) != 0) fatal("move the new root to /");
    if (chroot(".") != 0) fatal("chroot");
    if (chdir("/") != 0) fatal("chdir /");

    verify_readable(MACHINED);
    char *const machined_argv[] = {MACHINED, NULL};
    char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/", "TERM=linux", NULL};
    execve(MACHINED, machined_argv, envp);
    fatal("exec " MACHINED);
    return 1;
}
