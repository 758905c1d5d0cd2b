/* A fake libcuda.so.1 (the CUDA driver API) for rayscope's CUDA sampler: the sampler's child
 * loads it by name (ctypes.CDLL("libcuda.so.1"), found through LD_LIBRARY_PATH) and calls the
 * entry points below, which answer from a scenario file named by $RAYSCOPE_FAKE_CUDA_SCENARIO.
 * Built by tests/fake_cuda/__init__.py with `cc` (warnings are errors).
 *
 * Without $RAYSCOPE_FAKE_CUDA_SCENARIO (and $RAYSCOPE_FAKE_CUDA_LOG) the scenario is the file
 * `scenario.txt` (and the log `cuda.log`) beside this library: a child whose environment was
 * cut (the node agent's sampler passes no test variable) still finds its scenario.
 *
 * Every call that matters is appended to the file named by $RAYSCOPE_FAKE_CUDA_LOG, one line
 * each, `EVENT PID [DEVICE]`: `init`, `retain` (a primary context now exists: the process is a
 * GPU user and holds device memory), `meminfo`, `release`. A test that must show a GPU was
 * never sampled asserts that no `retain` (or no line at all) was written.
 *
 * Scenario file: one `key value` per line, `#` comments. Keys:
 *   init CODE                cuInit's return code (100 = CUDA_ERROR_NO_DEVICE)
 *   hang SECONDS             cuInit sleeps this long first (a hung driver, before any context)
 *   hang_meminfo SECONDS     cuMemGetInfo_v2 sleeps this long first (a context is held)
 *   driver VERSION           cuDriverGetVersion, e.g. 12040 (CUDA 12.4)
 *   count N                  number of CUDA devices
 *   devI.uuid TEXT           the device's UUID in NVML's text form (GPU-8-4-4-4-12 hex digits)
 *   devI.pci TEXT            cuDeviceGetPCIBusId's answer (CUDA's form: 0000:01:00.0)
 *   devI.memory FREE TOTAL   bytes, as cuMemGetInfo_v2 reports them in a context on devI
 *   devI.error.FIELD CODE    FIELD answers CODE: uuid, pci, retain, meminfo
 * CUDA's device order is its own (fastest first by default), not NVML's: a scenario lists its
 * devices in any order to show that the sampler maps them by UUID, never by index.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct {
    char bytes[16];
} CUuuid;

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    NOT_INITIALIZED = 3,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    NOT_SUPPORTED = 801,
};
#define MAX_DEVICES 16
#define MAX_ENTRIES 512

struct CUctx_st {
    int device;
};

#include "../support/scenario_entries.h"

static int loaded, initialised;
static struct CUctx_st contexts[MAX_DEVICES];
static int retained[MAX_DEVICES];
static CUcontext current;

/* $NAME, else the file `beside` in this library's own directory (into `buffer`). */
static const char *named(const char *name, const char *beside, char *buffer, size_t size) {
    const char *path = getenv(name);
    if (path) return path;
    Dl_info info;
    if (!dladdr((void *)named, &info) || !info.dli_fname) return NULL;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash) return NULL;
    int n = snprintf(buffer, size, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname, beside);
    return n > 0 && (size_t)n < size ? buffer : NULL;
}

static void load(void) {
    if (loaded) return;
    loaded = 1;
    char buffer[4096];
    const char *path = named("RAYSCOPE_FAKE_CUDA_SCENARIO", "scenario.txt", buffer, sizeof buffer);
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[512];
    read_entries(f, line, (int)sizeof line);
    fclose(f);
}

static const char *get(const char *key) {
    load();
    return lookup(key);
}

static const char *device_value(CUdevice d, const char *field) {
    char key[96];
    snprintf(key, sizeof key, "dev%d.%s", d, field);
    return get(key);
}

static CUresult device_error(CUdevice d, const char *field) {
    char name[64];
    snprintf(name, sizeof name, "error.%s", field);
    const char *code = device_value(d, name);
    return code ? atoi(code) : SUCCESS;
}

/* One line per event, written with one write(2) on an O_APPEND file: lines of concurrent
 * processes never interleave. */
static void note(const char *event, int device) {
    char buffer[4096];
    const char *path = named("RAYSCOPE_FAKE_CUDA_LOG", "cuda.log", buffer, sizeof buffer);
    if (!path) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0) return;
    char line[96];
    int n = device < 0 ? snprintf(line, sizeof line, "%s %d\n", event, (int)getpid())
                       : snprintf(line, sizeof line, "%s %d %d\n", event, (int)getpid(), device);
    if (n > 0 && write(fd, line, (size_t)n) < 0) { /* a test's log: nothing to do */
    }
    close(fd);
}

static int count(void) {
    const char *n = get("count");
    int c = n ? atoi(n) : 0;
    return c > MAX_DEVICES ? MAX_DEVICES : c;
}

static CUresult valid(CUdevice d) {
    if (!initialised) return NOT_INITIALIZED;
    return d < 0 || d >= count() ? INVALID_DEVICE : SUCCESS;
}

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return INVALID_VALUE;
    note("init", -1);
    const char *hang = get("hang");
    if (hang) sleep((unsigned int)atoi(hang));
    const char *code = get("init");
    CUresult err = code ? atoi(code) : SUCCESS;
    if (!err) initialised = 1;
    return err;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version) return INVALID_VALUE;
    const char *v = get("driver");
    *version = v ? atoi(v) : 12040;
    return SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
    if (!initialised) return NOT_INITIALIZED;
    *n = count();
    return SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    CUresult err = valid(ordinal);
    if (err) return err;
    *device = ordinal;
    return SUCCESS;
}

static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice d) {
    CUresult err = valid(d);
    if (!err) err = device_error(d, "uuid");
    if (err) return err;
    const char *text = device_value(d, "uuid");
    if (!text) return NOT_SUPPORTED;
    const char *dash = strchr(text, '-'); /* past "GPU-" or "MIG-" */
    const char *p = dash ? dash + 1 : text;
    int n = 0;
    memset(uuid, 0, sizeof *uuid);
    for (; *p && n < 32; p++) {
        if (*p == '-') continue;
        int v = hex(*p);
        if (v < 0) return INVALID_VALUE;
        uuid->bytes[n / 2] = (char)(uuid->bytes[n / 2] | (n % 2 ? v : v << 4));
        n++;
    }
    return n == 32 ? SUCCESS : INVALID_VALUE;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice d) { return cuDeviceGetUuid(uuid, d); }

CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice d) {
    CUresult err = valid(d);
    if (!err) err = device_error(d, "pci");
    if (err) return err;
    const char *v = device_value(d, "pci");
    if (!v || len <= 0) return INVALID_VALUE;
    snprintf(bus, (size_t)len, "%s", v);
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) {
    CUresult err = valid(d);
    if (!err) err = device_error(d, "retain");
    if (err) return err;
    note("retain", d);
    retained[d]++;
    contexts[d].device = d;
    *ctx = &contexts[d];
    return SUCCESS;
}

static CUresult release(CUdevice d) {
    CUresult err = valid(d);
    if (err) return err;
    if (retained[d] <= 0) return INVALID_CONTEXT;
    retained[d]--;
    note("release", d);
    if (current == &contexts[d] && !retained[d]) current = NULL;
    return SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return release(d); }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return release(d); }

CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (!initialised) return NOT_INITIALIZED;
    current = ctx;
    return SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) { return cuCtxSetCurrent(ctx); }

CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
    if (!initialised) return NOT_INITIALIZED;
    if (ctx) *ctx = current;
    current = NULL;
    return SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    if (!initialised) return NOT_INITIALIZED;
    if (!current || retained[current->device] <= 0) return INVALID_CONTEXT;
    CUdevice d = current->device;
    note("meminfo", d);
    const char *hang = get("hang_meminfo");
    if (hang) sleep((unsigned int)atoi(hang));
    CUresult err = device_error(d, "meminfo");
    if (err) return err;
    const char *v = device_value(d, "memory");
    unsigned long long f, t;
    if (!v || sscanf(v, "%llu %llu", &f, &t) != 2) return NOT_SUPPORTED;
    *free_bytes = (size_t)f;
    *total_bytes = (size_t)t;
    return SUCCESS;
}

static const struct {
    CUresult code;
    const char *name;
} names[] = {
    {0, "CUDA_SUCCESS"},
    {1, "CUDA_ERROR_INVALID_VALUE"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
    {100, "CUDA_ERROR_NO_DEVICE"},
    {101, "CUDA_ERROR_INVALID_DEVICE"},
    {201, "CUDA_ERROR_INVALID_CONTEXT"},
    {801, "CUDA_ERROR_NOT_SUPPORTED"},
    {999, "CUDA_ERROR_UNKNOWN"},
};

CUresult cuGetErrorName(CUresult error, const char **name) {
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].code == error) {
            *name = names[i].name;
            return SUCCESS;
        }
    return INVALID_VALUE;
}
