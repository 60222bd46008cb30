/* A stand-in libnvidia-ml.so.1 for the agent tests and the sandbox, driven by a JSON file named by $FAKENVML_CONFIG.
 *
 * It implements the NVML entry points gpusteward's agent reaches through nvidia-ml-py, with the
 * C signatures and struct layouts of nvml.h, so the real pynvml binding (ctypes signatures, struct
 * layouts, error codes) is what the tests exercise. The file is re-read on nvmlInit* and on every
 * nvmlDeviceGetCount_v2, so a test can change the GPUs (or lose one) mid-run.
 *
 * Config: {"driver_version": "550.90.07", "init_error": "DRIVER_NOT_LOADED",
 *   "gpus": [{"uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:07:00.0",
 *     "util_gpu": 87, "util_memory": 30, "memory_total": bytes, "memory_used": bytes,
 *     "temperature": 41, "power_mw": 250000,
 *     "processes": [{"pid": 4242, "used_memory": bytes}],
 *     "mps_processes": [{"pid": 4250, "used_memory": bytes}],
 *     "process_utilization": [{"pid": 4242, "sm": 37, "mem": 11, "timestamp": us}],
 *     "xid": 48, "xid_seq": 3,
 *     "errors": {"nvmlDeviceGetUtilizationRates": "NOT_SUPPORTED", "*": "GPU_IS_LOST"}}]}
 * XID events: each new "xid_seq" on a GPU (higher than the last one delivered) is one critical
 * XID event with the value "xid", delivered once by nvmlEventSetWait_v2 to an event set the GPU
 * is registered with. Every entry point holds one lock, as NVML is thread-safe: the agent waits
 * for events in one thread while it reads the GPUs in another.
 * "mps_processes" are MPS clients, which NVML lists apart (nvmlDeviceGetMPSComputeRunningProcesses,
 * process mode MPSCompute) from "processes" (the compute processes, where the MPS server shows).
 * Build with -DFAKENVML_NO_PROCESSES_V3 to leave both _v3 process queries out, as an older
 * driver's library would.
 */
#include <ctype.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>

typedef int nvmlReturn_t;
enum { OK = 0, UNINIT = 1, INVALID = 2, NOT_FOUND = 6, INSUFFICIENT = 7, TIMEOUT = 10,
       UNKNOWN = 999 };
#define XID_CRITICAL_ERROR 0x8ULL /* nvmlEventTypeXidCriticalError */

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int pid; unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;
typedef struct {
    unsigned int pid; unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef struct {
    char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct gpu gpu_t;
typedef struct {
    gpu_t *device; unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

/* The layouts nvml.h has on x86-64 and aarch64 Linux. */
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(offsetof(nvmlProcessUtilizationSample_t, timeStamp) == 8, "sample.timeStamp");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t");

#define MAXN 16
typedef struct { unsigned pid; unsigned long long mem; } proc_t;
typedef struct { unsigned pid, sm, mem; unsigned long long ts; } putil_t;
struct gpu {
    char uuid[96], name[96], pci[32];
    unsigned util_gpu, util_mem, temp, power_mw;
    unsigned long long mem_total, mem_used, xid, xid_seq;
    int nproc, nmps, nputil, nerr;
    proc_t procs[MAXN], mps[MAXN]; putil_t putil[MAXN];
    char err_fn[MAXN][64]; int err_code[MAXN];
};
typedef struct { unsigned long long mask[MAXN]; } event_set_t; /* event types by GPU index */

static gpu_t gpus[MAXN];
static int ngpu, initialized, init_error;
static unsigned long long delivered_seq[MAXN]; /* by GPU index: the last XID event handed out */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void unlock(int *unused) { (void)unused; pthread_mutex_unlock(&lock); }
/* Holds the lock until the function returns. */
#define LOCKED int locked_ __attribute__((cleanup(unlock))) = (pthread_mutex_lock(&lock), 0)
static char driver_version[80] = "550.90.07";

static const struct { const char *name; int code; const char *text; } ERRORS[] = {
    {"UNINITIALIZED", 1, "Uninitialized"}, {"INVALID_ARGUMENT", 2, "Invalid Argument"},
    {"NOT_SUPPORTED", 3, "Not Supported"}, {"NO_PERMISSION", 4, "Insufficient Permissions"},
    {"NOT_FOUND", 6, "Not Found"}, {"INSUFFICIENT_SIZE", 7, "Insufficient Size"},
    {"DRIVER_NOT_LOADED", 9, "Driver Not Loaded"}, {"TIMEOUT", 10, "Timeout"},
    {"LIBRARY_NOT_FOUND", 12, "NVML Shared Library Not Found"},
    {"FUNCTION_NOT_FOUND", 13, "Function Not Found"}, {"GPU_IS_LOST", 15, "GPU is lost"},
    {"RESET_REQUIRED", 16, "GPU requires restart"},
    {"LIB_RM_VERSION_MISMATCH", 18, "RM has detected an NVML/RM version mismatch"},
    {"UNKNOWN", 999, "Unknown Error"},
};

static int error_code(const char *name) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof *ERRORS; i++)
        if (!strcmp(ERRORS[i].name, name)) return ERRORS[i].code;
    return UNKNOWN;
}

/* ---- a small JSON reader, enough for the config above ---- */
static const char *p;
static void ws(void) { while (*p && isspace((unsigned char)*p)) p++; }
static void str(char *out, size_t cap) {
    size_t n = 0;
    ws(); if (*p != '"') return; p++;
    while (*p && *p != '"') {
        if (*p == '\\' && p[1]) p++;
        if (n + 1 < cap) out[n++] = *p;
        p++;
    }
    if (*p) p++;
    out[n] = 0;
}
static unsigned long long num(void) { ws(); return strtoull(p, (char **)&p, 10); }
static void skip(void);
static int next_key(char *key, size_t cap) { /* at '{' or ',' ; returns 0 at '}' */
    ws(); if (*p == '{' || *p == ',') p++;
    ws(); if (*p == '}') { p++; return 0; }
    str(key, cap); ws(); if (*p == ':') p++;
    return 1;
}
static int next_item(void) { /* at '[' or ',' ; returns 0 at ']' */
    ws(); if (*p == '[' || *p == ',') p++;
    ws(); if (*p == ']') { p++; return 0; }
    return 1;
}
static void skip(void) {
    char key[64];
    ws();
    if (*p == '{') { while (next_key(key, sizeof key)) skip(); }
    else if (*p == '[') { while (next_item()) skip(); }
    else if (*p == '"') str(key, sizeof key);
    else while (*p && !strchr(",}]", *p)) p++;
}
static void parse_proc(proc_t *pr) {
    char k[64];
    while (next_key(k, sizeof k))
        if (!strcmp(k, "pid")) pr->pid = num();
        else if (!strcmp(k, "used_memory")) pr->mem = num();
        else skip();
}
static void parse_putil(putil_t *u) {
    char k[64];
    while (next_key(k, sizeof k))
        if (!strcmp(k, "pid")) u->pid = num();
        else if (!strcmp(k, "sm")) u->sm = num();
        else if (!strcmp(k, "mem")) u->mem = num();
        else if (!strcmp(k, "timestamp")) u->ts = num();
        else skip();
}
static void parse_gpu(gpu_t *g) {
    char k[64], v[64];
    while (next_key(k, sizeof k)) {
        if (!strcmp(k, "uuid")) str(g->uuid, sizeof g->uuid);
        else if (!strcmp(k, "name")) str(g->name, sizeof g->name);
        else if (!strcmp(k, "pci_bus_id")) str(g->pci, sizeof g->pci);
        else if (!strcmp(k, "util_gpu")) g->util_gpu = num();
        else if (!strcmp(k, "util_memory")) g->util_mem = num();
        else if (!strcmp(k, "memory_total")) g->mem_total = num();
        else if (!strcmp(k, "memory_used")) g->mem_used = num();
        else if (!strcmp(k, "temperature")) g->temp = num();
        else if (!strcmp(k, "power_mw")) g->power_mw = num();
        else if (!strcmp(k, "xid")) g->xid = num();
        else if (!strcmp(k, "xid_seq")) g->xid_seq = num();
        else if (!strcmp(k, "processes"))
            while (next_item()) { if (g->nproc < MAXN) parse_proc(&g->procs[g->nproc++]); else skip(); }
        else if (!strcmp(k, "mps_processes"))
            while (next_item()) { if (g->nmps < MAXN) parse_proc(&g->mps[g->nmps++]); else skip(); }
        else if (!strcmp(k, "process_utilization"))
            while (next_item()) { if (g->nputil < MAXN) parse_putil(&g->putil[g->nputil++]); else skip(); }
        else if (!strcmp(k, "errors"))
            while (next_key(k, sizeof k)) {
                str(v, sizeof v);
                if (g->nerr < MAXN) {
                    snprintf(g->err_fn[g->nerr], sizeof g->err_fn[0], "%s", k);
                    g->err_code[g->nerr++] = error_code(v);
                }
            }
        else skip();
    }
}
static struct stat loaded; /* the file load() read last */
static void load(void) {
    const char *path = getenv("FAKENVML_CONFIG");
    FILE *f = path ? fopen(path, "rb") : NULL;
    memset(&loaded, 0, sizeof loaded);
    if (f) fstat(fileno(f), &loaded);
    char k[64], v[80], *text;
    long size;
    ngpu = 0; init_error = 0;
    memset(gpus, 0, sizeof gpus);
    if (!f) return;
    fseek(f, 0, SEEK_END); size = ftell(f); rewind(f);
    text = calloc(1, size + 1);
    if (fread(text, 1, size, f) != (size_t)size) size = 0;
    fclose(f);
    p = text;
    while (size && next_key(k, sizeof k)) {
        if (!strcmp(k, "driver_version")) str(driver_version, sizeof driver_version);
        else if (!strcmp(k, "init_error")) { str(v, sizeof v); init_error = error_code(v); }
        else if (!strcmp(k, "gpus"))
            while (next_item()) { if (ngpu < MAXN) parse_gpu(&gpus[ngpu++]); else skip(); }
        else skip();
    }
    free(text);
}

static void load_if_changed(void) { /* the event wait polls: re-read only a replaced file */
    const char *path = getenv("FAKENVML_CONFIG");
    struct stat now;
    if (!path || stat(path, &now)) return;
    if (now.st_ino != loaded.st_ino || now.st_mtim.tv_sec != loaded.st_mtim.tv_sec
        || now.st_mtim.tv_nsec != loaded.st_mtim.tv_nsec || now.st_size != loaded.st_size)
        load();
}

/* ---- NVML entry points ---- */
static int fail(const gpu_t *g, const char *fn) {
    if (!initialized) return UNINIT;
    if (g < gpus || g >= gpus + ngpu) return INVALID;
    for (int i = 0; i < g->nerr; i++)
        if (!strcmp(g->err_fn[i], fn) || !strcmp(g->err_fn[i], "*")) return g->err_code[i];
    return OK;
}
static nvmlReturn_t copy_out(char *out, unsigned len, const char *s) {
    if (strlen(s) + 1 > len) return INSUFFICIENT;
    strcpy(out, s);
    return OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    LOCKED;
    (void)flags;
    load();
    if (init_error) return init_error;
    initialized++;
    return OK;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) {
    LOCKED;
    if (!initialized) return UNINIT;
    initialized--;
    return OK;
}
const char *nvmlErrorString(nvmlReturn_t r) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof *ERRORS; i++)
        if (ERRORS[i].code == r) return ERRORS[i].text;
    return r == OK ? "Success" : "Unknown Error";
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    LOCKED;
    return initialized ? copy_out(version, length, driver_version) : UNINIT;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    LOCKED;
    if (!initialized) return UNINIT;
    load();
    *count = ngpu;
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, gpu_t **device) {
    LOCKED;
    if (!initialized) return UNINIT;
    if (index >= (unsigned)ngpu) return INVALID;
    *device = &gpus[index];
    return OK;
}
#define GUARD(fn) LOCKED; int rc_ = fail(g, fn); if (rc_) return rc_
nvmlReturn_t nvmlDeviceGetUUID(gpu_t *g, char *uuid, unsigned int length) {
    GUARD("nvmlDeviceGetUUID");
    return copy_out(uuid, length, g->uuid);
}
nvmlReturn_t nvmlDeviceGetName(gpu_t *g, char *name, unsigned int length) {
    GUARD("nvmlDeviceGetName");
    return copy_out(name, length, g->name);
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(gpu_t *g, nvmlPciInfo_t *pci) {
    GUARD("nvmlDeviceGetPciInfo_v3");
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", g->pci + (strlen(g->pci) > 12 ? 4 : 0));
    return OK;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(gpu_t *g, nvmlUtilization_t *u) {
    GUARD("nvmlDeviceGetUtilizationRates");
    u->gpu = g->util_gpu; u->memory = g->util_mem;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(gpu_t *g, nvmlMemory_t *m) {
    GUARD("nvmlDeviceGetMemoryInfo");
    m->total = g->mem_total; m->used = g->mem_used; m->free = g->mem_total - g->mem_used;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTemperature(gpu_t *g, int sensor, unsigned int *temp) {
    GUARD("nvmlDeviceGetTemperature");
    if (sensor != 0) return INVALID;
    *temp = g->temp;
    return OK;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(gpu_t *g, unsigned int *power) {
    GUARD("nvmlDeviceGetPowerUsage");
    *power = g->power_mw;
    return OK;
}
static unsigned long long now_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (unsigned long long)tv.tv_sec * 1000000ULL + tv.tv_usec;
}
nvmlReturn_t nvmlDeviceGetProcessUtilization(gpu_t *g, nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count, unsigned long long lastSeen) {
    GUARD("nvmlDeviceGetProcessUtilization");
    unsigned n = 0, want = 0;
    for (int i = 0; i < g->nputil; i++) want += (g->putil[i].ts ? g->putil[i].ts : now_us()) > lastSeen;
    if (!want) return NOT_FOUND; /* "no valid sample entries since lastSeen" */
    if (!samples || *count < want) { *count = want; return INSUFFICIENT; }
    for (int i = 0; i < g->nputil; i++) {
        unsigned long long ts = g->putil[i].ts ? g->putil[i].ts : now_us();
        if (ts <= lastSeen) continue;
        samples[n] = (nvmlProcessUtilizationSample_t){g->putil[i].pid, ts, g->putil[i].sm,
                                                      g->putil[i].mem, 0, 0};
        n++;
    }
    *count = n;
    return OK;
}
#ifndef FAKENVML_NO_PROCESSES_V3
static nvmlReturn_t list_procs(const proc_t *procs, int n, unsigned int *count,
                               nvmlProcessInfo_v2_t *infos) {
    if (n == 0) { *count = 0; return OK; }
    if (!infos || *count < (unsigned)n) { *count = n; return INSUFFICIENT; }
    for (int i = 0; i < n; i++)
        infos[i] = (nvmlProcessInfo_v2_t){procs[i].pid, procs[i].mem, 0xFFFFFFFF, 0xFFFFFFFF};
    *count = n;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(gpu_t *g, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos) {
    GUARD("nvmlDeviceGetComputeRunningProcesses_v3");
    return list_procs(g->procs, g->nproc, count, infos);
}
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(gpu_t *g, unsigned int *count,
                                                        nvmlProcessInfo_v2_t *infos) {
    GUARD("nvmlDeviceGetMPSComputeRunningProcesses_v3");
    return list_procs(g->mps, g->nmps, count, infos);
}
#endif

/* ---- XID events ---- */
nvmlReturn_t nvmlEventSetCreate(event_set_t **set) {
    LOCKED;
    if (!initialized) return UNINIT;
    *set = calloc(1, sizeof **set);
    return *set ? OK : UNKNOWN;
}
nvmlReturn_t nvmlEventSetFree(event_set_t *set) {
    LOCKED;
    if (!initialized) return UNINIT;
    free(set);
    return OK;
}
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(gpu_t *g, unsigned long long *types) {
    GUARD("nvmlDeviceGetSupportedEventTypes");
    *types = 0x1 | 0x2 | 0x4 | XID_CRITICAL_ERROR | 0x10; /* ECC, P-state, XID, clock */
    return OK;
}
nvmlReturn_t nvmlDeviceRegisterEvents(gpu_t *g, unsigned long long types, event_set_t *set) {
    GUARD("nvmlDeviceRegisterEvents");
    if (!set) return INVALID;
    int i = g - gpus;
    if (!(set->mask[i] & XID_CRITICAL_ERROR) && (types & XID_CRITICAL_ERROR))
        delivered_seq[i] = g->xid_seq; /* only XIDs after registration are events */
    set->mask[i] |= types;
    return OK;
}
static int next_event(event_set_t *set, nvmlEventData_t *data) {
    for (int i = 0; i < ngpu; i++) {
        if (!(set->mask[i] & XID_CRITICAL_ERROR) || gpus[i].xid_seq <= delivered_seq[i]) continue;
        delivered_seq[i] = gpus[i].xid_seq;
        *data = (nvmlEventData_t){&gpus[i], XID_CRITICAL_ERROR, gpus[i].xid, 0xFFFFFFFF,
                                  0xFFFFFFFF};
        return 1;
    }
    return 0;
}
nvmlReturn_t nvmlEventSetWait_v2(event_set_t *set, nvmlEventData_t *data, unsigned int timeoutms) {
    unsigned long long deadline = now_us() + 1000ULL * timeoutms;
    for (;;) {
        int rc = OK, found = 0;
        pthread_mutex_lock(&lock);
        if (!initialized) rc = UNINIT;
        else if (!set || !data) rc = INVALID;
        else { load_if_changed(); found = next_event(set, data); }
        pthread_mutex_unlock(&lock);
        if (rc != OK || found) return rc;
        if (now_us() >= deadline) return TIMEOUT;
        nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
    }
}
