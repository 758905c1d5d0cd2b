/* A fake libnvidia-ml.so.1 for rayscope's tests: the real pynvml binding loads it (through
 * LD_LIBRARY_PATH) and calls the NVML entry points below, which answer from a scenario file
 * named by $RAYSCOPE_FAKE_NVML_SCENARIO. Built by tests/fake_nvml/__init__.py with `cc`.
 *
 * Scenario file: one `key value` per line, `#` comments. The file is read again whenever it
 * changes (its inode, size or mtime): a live test changes memory and processes over time by
 * writing a new file and renaming it over the old one (tests/fake_nvml/__init__.py
 * write_scenario), so a reader never sees half a file. Keys:
 *   init CODE                       nvmlInit's return code (18 = driver/library mismatch)
 *   init_requires PATH              nvmlInit answers 9 (driver not loaded) until PATH exists
 *   hang SECONDS                    nvmlDeviceGetCount sleeps this long first (a hung driver)
 *   count N                         number of GPUs
 *   driver VERSION
 *   gpuI.name / .uuid / .pci TEXT
 *   gpuI.memory TOTAL USED RESERVED bytes (v2 figures; v1 reports USED+RESERVED as used)
 *   gpuI.util GPU_PCT MEM_PCT
 *   gpuI.temperature C / .power MW / .power_limit MW
 *   gpuI.mig 0|1                    absent: MIG Not Supported
 *   gpuI.compute PID BYTES [GI CI]  one line per process; BYTES "-" = not available
 *   gpuI.graphics PID BYTES [GI CI]
 *   gpuI.migJ.<same keys> , .gi ID , .ci ID   MIG instance J of GPU I
 *   gpuI.virtualization MODE        nvmlDeviceGetVirtualizationMode: 0 none (bare metal),
 *                                   1 pass-through, 2 vGPU guest, 3 host vGPU, 4 host vSGA;
 *                                   absent: Not Supported
 *   gpuI.compute_mode MODE          nvmlDeviceGetComputeMode: 0 default, 1 exclusive thread,
 *                                   2 prohibited, 3 exclusive process; absent: Not Supported
 *   gpuI.mps PID BYTES [GI CI]      one line per MPS client (nvmlDeviceGetMPSComputeRunningProcesses);
 *                                   none: the call answers an empty list, as without MPS
 *   gpuI.proc_util PID SM MEM       one line per process sample of nvmlDeviceGetProcessesUtilizationInfo
 *                                   (driver 550+): SM and memory-bus busy percentages; none: the call
 *                                   answers Not Found, as a device with no sample does
 *   <device>.error.FIELD CODE       FIELD answers CODE: handle, name, uuid, pci, memory,
 *                                   memory_v2, util, temperature, power, power_limit, mig,
 *                                   compute, graphics, virtualization, compute_mode, mps, proc_util
 *
 * Health (absent key = Not Supported):
 *   gpuI.ecc_uncorrected N          volatile uncorrected ECC errors
 *   gpuI.retired_pending 0|1        retired pages pending
 *   gpuI.remapped CORR UNC PENDING FAILURE   row remapping
 *   gpuI.throttle MASK              current clock event (throttle) reasons, e.g. 0x48
 *   gpuI.xid CODE                   one line per XID event, delivered once by nvmlEventSetWait_v2
 *
 * Driver eras (one build each, tests/fake_nvml/__init__.py): the default build exports what a
 * current driver (>= 510.39) does; -DDRIVER_R470 builds an R450/R470 library: no _v3 process
 * lists and no nvmlDeviceGetMemoryInfo_v2 (both absent, as on those drivers), the _v2 process
 * lists present (the MPS list too: _v2 only). The symbol set is the era's, so a binding that
 * only calls _v3 finds nothing. -DNO_MODES builds a library without the virtualization mode,
 * compute mode and MPS list entry points at all (pynvml's lookup answers Function Not Found):
 * the path of a driver that lacks them, whichever release that is.
 */
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    OK = 0,
    INVALID_ARGUMENT = 2,
    NOT_SUPPORTED = 3,
    NOT_FOUND = 6,
    INSUFFICIENT_SIZE = 7,
    ARGUMENT_VERSION_MISMATCH = 25,
};
#define MAX_GPUS 8
#define MAX_MIG 7
#define MAX_ENTRIES 2048
#define MEMORY_V2 0x02000028u

struct nvmlDevice_st {
    int slot;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static struct nvmlDevice_st devices[MAX_GPUS * (MAX_MIG + 1)];
#include "../support/scenario_entries.h"

static struct stat seen; /* the scenario file as last read: dev, ino, size, mtime */
static int have_seen;

static void forget(void) {
    for (int i = 0; i < entries; i++) {
        free(keys[i]);
        free(values[i]);
    }
    entries = 0;
}

static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* (Re)read the scenario when it is new or has changed since the last read. A file that cannot
 * be read (gone, being replaced) keeps the last scenario. */
static void load(void) {
    const char *path = getenv("RAYSCOPE_FAKE_NVML_SCENARIO");
    struct stat now;
    if (!path || stat(path, &now) != 0) return;
    if (have_seen && same_file(&now, &seen)) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    forget();
    seen = now;
    have_seen = 1;
    char line[1024];
    read_entries(f, line, (int)sizeof line);
    fclose(f);
}

static const char *get(const char *key) {
    load();
    return lookup(key);
}

/* Slot s < MAX_GPUS is GPU s; above, MIG instance (s - MAX_GPUS) % MAX_MIG of GPU (s - MAX_GPUS) / MAX_MIG. */
static void prefix(nvmlDevice_t d, char *out, size_t n) {
    int s = d->slot;
    if (s < MAX_GPUS)
        snprintf(out, n, "gpu%d", s);
    else
        snprintf(out, n, "gpu%d.mig%d", (s - MAX_GPUS) / MAX_MIG, (s - MAX_GPUS) % MAX_MIG);
}

static const char *device_value(nvmlDevice_t d, const char *field) {
    char key[128], p[32];
    prefix(d, p, sizeof p);
    snprintf(key, sizeof key, "%s.%s", p, field);
    return get(key);
}

static nvmlReturn_t device_error(nvmlDevice_t d, const char *field) {
    char name[64];
    snprintf(name, sizeof name, "error.%s", field);
    const char *code = device_value(d, name);
    return code ? atoi(code) : OK;
}

static nvmlReturn_t string_field(nvmlDevice_t d, const char *field, char *buf, unsigned int len) {
    nvmlReturn_t err = device_error(d, field);
    if (err) return err;
    const char *v = device_value(d, field);
    if (!v) return NOT_SUPPORTED;
    snprintf(buf, len, "%s", v);
    return OK;
}

static nvmlReturn_t uint_field(nvmlDevice_t d, const char *field, unsigned int *out) {
    nvmlReturn_t err = device_error(d, field);
    if (err) return err;
    const char *v = device_value(d, field);
    if (!v) return NOT_SUPPORTED;
    *out = (unsigned int)strtoul(v, NULL, 10);
    return OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    load();
    const char *requires = get("init_requires");
    if (requires && access(requires, F_OK) != 0) return 9; /* NVML_ERROR_DRIVER_NOT_LOADED */
    const char *code = get("init");
    return code ? atoi(code) : OK;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t result) {
    (void)result;
    return "fake NVML error";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    const char *v = get("driver");
    if (!v) return NOT_SUPPORTED;
    snprintf(version, length, "%s", v);
    return OK;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    const char *hang = get("hang");
    if (hang) sleep((unsigned int)atoi(hang));
    const char *n = get("count");
    *count = n ? (unsigned int)atoi(n) : 0;
    return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    const char *n = get("count");
    unsigned int count = n ? (unsigned int)atoi(n) : 0;
    if (index >= count || index >= MAX_GPUS) return INVALID_ARGUMENT;
    devices[index].slot = (int)index;
    nvmlReturn_t err = device_error(&devices[index], "handle");
    if (err) return err;
    *device = &devices[index];
    return OK;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    return string_field(d, "name", name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    return string_field(d, "uuid", uuid, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    nvmlReturn_t err = string_field(d, "pci", pci->busId, sizeof pci->busId);
    if (!err) memcpy(pci->busIdLegacy, pci->busId, sizeof pci->busIdLegacy - 1);
    return err;
}

static nvmlReturn_t memory(nvmlDevice_t d, const char *field, unsigned long long out[3]) {
    nvmlReturn_t err = device_error(d, field);
    if (err) return err;
    const char *v = device_value(d, "memory");
    if (!v) return NOT_SUPPORTED;
    if (sscanf(v, "%llu %llu %llu", &out[0], &out[1], &out[2]) != 3) return NOT_SUPPORTED;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    unsigned long long v[3];
    nvmlReturn_t err = memory(d, "memory", v);
    if (err) return err;
    m->total = v[0];
    m->used = v[1] + v[2];
    m->free = v[0] - m->used;
    return OK;
}

#ifndef DRIVER_R470
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (m->version != MEMORY_V2) return ARGUMENT_VERSION_MISMATCH;
    unsigned long long v[3];
    nvmlReturn_t err = memory(d, "memory_v2", v);
    if (!err) err = device_error(d, "memory");
    if (err) return err;
    m->total = v[0];
    m->used = v[1];
    m->reserved = v[2];
    m->free = v[0] - v[1] - v[2];
    return OK;
}
#endif

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    nvmlReturn_t err = device_error(d, "util");
    if (err) return err;
    const char *v = device_value(d, "util");
    if (!v || sscanf(v, "%u %u", &u->gpu, &u->memory) < 1) return NOT_SUPPORTED;
    return OK;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *temp) {
    if (sensor != 0) return INVALID_ARGUMENT;
    return uint_field(d, "temperature", temp);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) { return uint_field(d, "power", mw); }

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    return uint_field(d, "power_limit", mw);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    nvmlReturn_t err = uint_field(d, "mig", current);
    if (!err) *pending = *current;
    return err;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    unsigned int mode;
    nvmlReturn_t err = uint_field(d, "mig", &mode);
    if (err) return err;
    *count = MAX_MIG;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    if (d->slot >= MAX_GPUS || index >= MAX_MIG) return INVALID_ARGUMENT;
    int slot = MAX_GPUS + d->slot * MAX_MIG + (int)index;
    devices[slot].slot = slot;
    if (!device_value(&devices[slot], "name")) return NOT_FOUND;
    nvmlReturn_t err = device_error(&devices[slot], "handle");
    if (err) return err;
    *mig = &devices[slot];
    return OK;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) { return uint_field(d, "gi", id); }

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) { return uint_field(d, "ci", id); }

/* NVML's two-call protocol: a NULL array (or one too small) answers INSUFFICIENT_SIZE with the count. */
static nvmlReturn_t processes(nvmlDevice_t d, const char *kind, unsigned int *count, nvmlProcessInfo_t *out) {
    nvmlReturn_t err = device_error(d, kind);
    if (err) return err;
    char key[128], p[32];
    prefix(d, p, sizeof p);
    snprintf(key, sizeof key, "%s.%s", p, kind);
    unsigned int n = 0;
    for (int i = 0; i < entries; i++) {
        if (strcmp(keys[i], key)) continue;
        if (out && n < *count) {
            char bytes[32] = "";
            unsigned int gi = 0xFFFFFFFFu, ci = 0xFFFFFFFFu;
            sscanf(values[i], "%u %31s %u %u", &out[n].pid, bytes, &gi, &ci);
            out[n].usedGpuMemory = strcmp(bytes, "-") ? strtoull(bytes, NULL, 10) : 0xFFFFFFFFFFFFFFFFull;
            out[n].gpuInstanceId = gi;
            out[n].computeInstanceId = ci;
        }
        n++;
    }
    if (n == 0) {
        *count = 0;
        return OK;
    }
    if (!out || *count < n) {
        *count = n;
        return INSUFFICIENT_SIZE;
    }
    *count = n;
    return OK;
}

#ifndef DRIVER_R470
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(d, "compute", count, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(d, "graphics", count, infos);
}

/* Driver 550+. Ray 2.50-2.56's dashboard took memUtil (the share of time the memory bus was
 * busy) for the share of memory a process holds (ray-project/ray#61456): a sample here shows it. */
typedef struct {
    unsigned long long timeStamp;
    unsigned int pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;
typedef struct {
    unsigned int version, processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_t;
#define PROCESSES_UTILIZATION_INFO_V1 0x01000018u

nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t d, nvmlProcessesUtilizationInfo_t *info) {
    nvmlReturn_t err = device_error(d, "proc_util");
    if (err) return err;
    if (info->version != PROCESSES_UTILIZATION_INFO_V1) return ARGUMENT_VERSION_MISMATCH;
    char key[128], p[32];
    prefix(d, p, sizeof p);
    snprintf(key, sizeof key, "%s.proc_util", p);
    unsigned int n = 0;
    for (int i = 0; i < entries; i++) {
        if (strcmp(keys[i], key)) continue;
        if (info->procUtilArray && n < info->processSamplesCount) {
            nvmlProcessUtilizationInfo_v1_t *sample = &info->procUtilArray[n];
            memset(sample, 0, sizeof *sample);
            sscanf(values[i], "%u %u %u", &sample->pid, &sample->smUtil, &sample->memUtil);
            sample->timeStamp = info->lastSeenTimeStamp + 1;
        }
        n++;
    }
    if (n == 0) return NOT_FOUND;
    if (!info->procUtilArray || info->processSamplesCount < n) {
        info->processSamplesCount = n;
        return INSUFFICIENT_SIZE;
    }
    info->processSamplesCount = n;
    return OK;
}
#endif

/* R450 onwards: the same struct layout as _v3 (pid, memory, GPU and compute instance). */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(d, "compute", count, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(d, "graphics", count, infos);
}

#ifndef NO_MODES
/* MPS clients: the same struct as the other process lists. */
#ifndef DRIVER_R470
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(d, "mps", count, infos);
}
#endif

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(d, "mps", count, infos);
}

/* nvmlGpuVirtualizationMode_t and nvmlComputeMode_t are C enums: 4 bytes. */
nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t d, unsigned int *mode) {
    return uint_field(d, "virtualization", mode);
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, unsigned int *mode) { return uint_field(d, "compute_mode", mode); }
#endif

/* Health. */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int errorType, int counterType, unsigned long long *count) {
    if (errorType != 1 || counterType != 0) return NOT_SUPPORTED; /* only uncorrected, volatile */
    nvmlReturn_t err = device_error(d, "ecc");
    if (err) return err;
    const char *v = device_value(d, "ecc_uncorrected");
    if (!v) return NOT_SUPPORTED;
    *count = strtoull(v, NULL, 10);
    return OK;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, int *pending) {
    unsigned int v = 0;
    nvmlReturn_t err = uint_field(d, "retired_pending", &v);
    if (!err) *pending = (int)v;
    return err;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                                       unsigned int *failure) {
    nvmlReturn_t err = device_error(d, "remapped");
    if (err) return err;
    const char *v = device_value(d, "remapped");
    if (!v || sscanf(v, "%u %u %u %u", corr, unc, pending, failure) != 4) return NOT_SUPPORTED;
    return OK;
}

static nvmlReturn_t clock_reasons(nvmlDevice_t d, unsigned long long *reasons) {
    nvmlReturn_t err = device_error(d, "throttle");
    if (err) return err;
    const char *v = device_value(d, "throttle");
    if (!v) return NOT_SUPPORTED;
    *reasons = strtoull(v, NULL, 0);
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *r) { return clock_reasons(d, r); }
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) { return clock_reasons(d, r); }

/* XID events: each scenario `gpuI.xid CODE` line is delivered once, to a set the GPU registered with. */
#define XID_EVENT 0x8ull
#define TIMEOUT 10
struct nvmlEventSet_st {
    int delivered[MAX_GPUS];
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
static struct nvmlEventSet_st event_set;
static unsigned long long registered[MAX_GPUS];

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    memset(&event_set, 0, sizeof event_set);
    *set = &event_set;
    return OK;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    nvmlReturn_t err = device_error(d, "events");
    if (err) return err;
    *types = XID_EVENT;
    return OK;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    (void)set;
    nvmlReturn_t err = device_error(d, "events");
    if (err) return err;
    if (d->slot >= MAX_GPUS) return NOT_SUPPORTED;
    registered[d->slot] |= types;
    return OK;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    (void)timeoutms;
    load();
    for (int g = 0; g < MAX_GPUS; g++) {
        if (!(registered[g] & XID_EVENT)) continue;
        char key[32];
        snprintf(key, sizeof key, "gpu%d.xid", g);
        int seen = 0;
        for (int i = 0; i < entries; i++) {
            if (strcmp(keys[i], key)) continue;
            if (seen++ < set->delivered[g]) continue;
            set->delivered[g]++;
            memset(data, 0, sizeof *data);
            data->device = &devices[g];
            data->eventType = XID_EVENT;
            data->eventData = strtoull(values[i], NULL, 10);
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
            return OK;
        }
    }
    return TIMEOUT;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    (void)set;
    return OK;
}
