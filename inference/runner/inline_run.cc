#include "inline_run.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// The two Lite (MindRT) symbols involved, declared with the signatures Lite exports them with; only their
// names matter to the linker.
namespace mindspore {
class ActorBase;
class ActorThreadPool {
 public:
  void PushActorToQueue(ActorBase *actor);
};
}  // namespace mindspore

namespace {

constexpr const char *kPush = "_ZN9mindspore15ActorThreadPool16PushActorToQueueEPNS_9ActorBaseE";
constexpr const char *kRun = "_ZN9mindspore9ActorBase3RunEv";
// Each actor an inline actor sends data to runs nested inside it; a deeper chain (e.g. a long control-flow
// loop) goes to the queue instead of growing the caller's stack.
constexpr int kMaxDepth = 64;

thread_local int t_scopes = 0;  // open InlineScopes on this thread
thread_local int t_depth = 0;   // actors running inline on this thread, nested
std::atomic<uint64_t> g_inline_runs{0};

using PushFn = void (*)(mindspore::ActorThreadPool *, mindspore::ActorBase *);
using RunFn = void (*)(mindspore::ActorBase *);

struct LiteSymbols {
  PushFn push = nullptr;  // Lite's own PushActorToQueue (the queue)
  RunFn run = nullptr;    // ActorBase::Run: drains the actor's mailbox, as Lite's worker calls it
};

// The first loaded object other than this one that defines `name` (load order is the order the dynamic linker
// searches): Lite's definition, whichever of its libraries carries the actor runtime.
void *FindElsewhere(const char *name) {
  struct Search {
    const char *name;
    void *self;
    void *found;
  } s{name, reinterpret_cast<void *>(&FindElsewhere), nullptr};
  Dl_info mine{};
  dladdr(s.self, &mine);
  s.self = mine.dli_fbase;
  dl_iterate_phdr(
    [](dl_phdr_info *info, size_t, void *data) -> int {
      auto *s = static_cast<Search *>(data);
      if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;  // the executable: maybe us
      void *handle = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
      if (handle == nullptr) return 0;
      void *sym = dlsym(handle, s->name);
      Dl_info where{};
      const bool other = sym != nullptr && dladdr(sym, &where) && where.dli_fbase != s->self;
      dlclose(handle);
      if (other) s->found = sym;
      return other ? 1 : 0;
    },
    &s);
  return s.found;
}

const LiteSymbols &Lite() {
  static const LiteSymbols lite = [] {
    LiteSymbols l;
    l.push = reinterpret_cast<PushFn>(FindElsewhere(kPush));
    l.run = reinterpret_cast<RunFn>(FindElsewhere(kRun));
    if (l.push == nullptr) {  // cannot happen while Lite calls this: it defines the symbol it calls
      std::fprintf(stderr, "msrl-lite: Lite's ActorThreadPool::PushActorToQueue not found in this process\n");
      std::abort();
    }
    return l;
  }();
  return lite;
}

}  // namespace

void mindspore::ActorThreadPool::PushActorToQueue(ActorBase *actor) {
  const LiteSymbols &lite = Lite();
  if (actor == nullptr || t_scopes == 0 || t_depth >= kMaxDepth || lite.run == nullptr) {
    lite.push(this, actor);
    return;
  }
  struct Nested {
    Nested() { ++t_depth; }
    ~Nested() { --t_depth; }
  } nested;
  g_inline_runs.fetch_add(1, std::memory_order_relaxed);
  msrl::FloatMode mode(msrl::FloatMode::kFlushDenormals);  // as Lite's workers compute
  lite.run(actor);
}

namespace msrl {

InlineScope::InlineScope(bool on) : on_(on) {
  if (on_) ++t_scopes;
}

InlineScope::~InlineScope() {
  if (on_) --t_scopes;
}

bool InlineWanted() {
  const char *v = std::getenv("MSRL_LITE_INLINE");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

}  // namespace msrl

extern "C" uint32_t msrl_lite_float_mode() {
#if defined(__x86_64__) || defined(__i386__)
  return _mm_getcsr();
#else
  return 0;
#endif
}

extern "C" void msrl_lite_set_float_mode(uint32_t mode) {
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(mode);
#else
  (void)mode;
#endif
}

extern "C" uint64_t msrl_lite_inline_runs() { return g_inline_runs.load(std::memory_order_relaxed); }
