/* libmsrl-lite.so driven as lite_inprocess.py drives it, from C: where no Python of the library's architecture runs
 * (the aarch64 build, run under qemu-user by test_lite_aarch64.py). Loads the two libraries as ctypes does, keeping
 * the caller's float mode; opens MODEL twice (inline and handed off to Lite's actor thread); feeds both the same
 * float32 rows (ROWS x COLS values of VALUE) and prints one JSON line: the float modes seen, each way's outputs' bytes
 * as hex, and each model's inline counts. Usage: driver LIBDIR MODEL ROWS COLS VALUE */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct call {
  void *handle;
  int32_t n, n_out;
  void *const *data;
  const uint64_t *nbytes;
  const int64_t *dims;
  const int32_t *ranks;
  void *const *out;
  const uint64_t *out_bytes;
  char *error;
  uint64_t error_len;
};

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (p == NULL) {
    fprintf(stderr, "missing %s\n", name);
    exit(2);
  }
  return p;
}

int main(int argc, char **argv) {
  if (argc != 6) return 2;
  char path[4096];
  snprintf(path, sizeof path, "%s/libmsrl-lite-inline.so", argv[1]);
  void *inl = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (inl == NULL) return fprintf(stderr, "%s\n", dlerror()), 2;
  uint32_t (*get_mode)(void) = (uint32_t(*)(void))sym(inl, "msrl_lite_float_mode");
  void (*set_mode)(uint32_t) = (void (*)(uint32_t))sym(inl, "msrl_lite_set_float_mode");
  const uint32_t before = get_mode();
  snprintf(path, sizeof path, "%s/libmsrl-lite.so", argv[1]);
  void *lib = dlopen(path, RTLD_NOW);
  if (lib == NULL) return fprintf(stderr, "%s\n", dlerror()), 2;
  const uint32_t loaded = get_mode();
  set_mode(before);
  /* path, device, device id, threads, inline mode, precision mode, runtime config, kind, error, versions */
  typedef void *(*open_fn)(const char *, const char *, uint32_t, int, int, const char *, const char *, char *, size_t,
                           char *, size_t, int64_t *);
  open_fn open_model = (open_fn)sym(lib, "msrl_lite_open");
  int (*predict)(const struct call *) = (int (*)(const struct call *))sym(lib, "msrl_lite_predict");
  int (*fetch)(void *, int, void *const *, const uint64_t *, char *, size_t) =
      (int (*)(void *, int, void *const *, const uint64_t *, char *, size_t))sym(lib, "msrl_lite_fetch");
  int (*count)(void *, int) = (int (*)(void *, int))sym(lib, "msrl_lite_count");
  void (*stats)(void *, uint64_t *) = (void (*)(void *, uint64_t *))sym(lib, "msrl_lite_inline_calls");

  const int rows = atoi(argv[3]), cols = atoi(argv[4]);
  const float value = strtof(argv[5], NULL);
  float *feed = malloc(sizeof(float) * rows * cols);
  for (int i = 0; i < rows * cols; ++i) feed[i] = value;
  const uint64_t nbytes = sizeof(float) * rows * cols;
  const int64_t dims[2] = {rows, cols};
  const int32_t ranks[1] = {2};
  void *data[1] = {feed};
  printf("{\"mode_before\": %u, \"mode_loaded\": %u", before, loaded);
  for (int way = 1; way >= 0; --way) {
    char kind[32], error[4096];
    int64_t versions[2];
    void *h = open_model(argv[2], "cpu", 0, 1, way, "", "", kind, sizeof kind, error, sizeof error, versions);
    if (h == NULL) return fprintf(stderr, "open: %s\n", error), 2;
    struct call c = {h, 1, 0, data, &nbytes, dims, ranks, NULL, NULL, error, sizeof error};
    if (predict(&c) != 0 || count(h, 1) != 1) return fprintf(stderr, "predict: %s\n", error), 2;
    float out[4096];
    const uint64_t out_bytes = sizeof(float) * 2 * rows;  /* the driver's models answer 2 values per row */
    void *outs[1] = {out};
    if (fetch(h, 1, outs, &out_bytes, error, sizeof error) != 0) return fprintf(stderr, "fetch: %s\n", error), 2;
    uint64_t s[3];
    stats(h, s);
    printf(", \"%s\": {\"calls\": %llu, \"inline_calls\": %llu, \"mode_after\": %u, \"bytes\": \"", way ? "inline" : "handoff",
           (unsigned long long)s[0], (unsigned long long)s[1], get_mode());
    for (uint64_t i = 0; i < out_bytes; ++i) printf("%02x", ((unsigned char *)out)[i]);
    printf("\"}");
  }
  printf("}\n");
  fflush(stdout);
  _exit(0);  /* as the runner: Lite's static destructors race its own threads at exit */
}
