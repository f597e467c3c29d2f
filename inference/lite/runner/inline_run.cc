#include "inline_run.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#ifndef MSRL_LITE_INLINE_DEFAULT
#define MSRL_LITE_INLINE_DEFAULT 0  // build_lite.sh passes its decision; a build without one runs Lite's hand-off
#endif

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

thread_local msrl::InlineScope *t_scope = nullptr;  // the innermost open InlineScope on this thread
thread_local int t_depth = 0;                         // actors running inline on this thread, nested

using PushFn = void (*)(mindspore::ActorThreadPool *, mindspore::ActorBase *);
using RunFn = void (*)(mindspore::ActorBase *);

// `symbol` as defined by the library whose code built `object` (found from its vtable pointer, its first word):
// the pool's own PushActorToQueue and the actor's own ActorBase::Run. Lite carries MindRT in several of its
// libraries (libmindspore_core.so and its plugins); each object is handled by the copy compiled with it.
void *OwnersSymbol(const void *object, const char *symbol) {
  const void *vtable = *static_cast<const void *const *>(object);
  Dl_info owner{};
  if (dladdr(vtable, &owner) == 0 || owner.dli_fname == nullptr) return nullptr;
  void *handle = dlopen(owner.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void *sym = dlsym(handle, symbol);  // the owner first, then its dependencies
  dlclose(handle);
  Dl_info where{}, mine{};
  const bool ours = sym != nullptr && dladdr(sym, &where) != 0 &&
                    dladdr(reinterpret_cast<void *>(&OwnersSymbol), &mine) != 0 && where.dli_fbase == mine.dli_fbase;
  return ours ? nullptr : sym;
}

// OwnersSymbol, remembered per vtable (a process holds a handful of pool and actor classes).
template <typename Fn>
Fn Resolve(const void *object, const char *symbol) {
  static std::mutex mu;
  static std::vector<std::pair<const void *, Fn>> known;
  const void *vtable = *static_cast<const void *const *>(object);
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto &[v, fn] : known) {
      if (v == vtable) return fn;
    }
  }
  Fn fn = reinterpret_cast<Fn>(OwnersSymbol(object, symbol));  // outside the lock: it takes the loader's own
  std::lock_guard<std::mutex> lock(mu);
  known.emplace_back(vtable, fn);
  return fn;
}

}  // namespace

void mindspore::ActorThreadPool::PushActorToQueue(ActorBase *actor) {
  msrl::InlineScope *scope = t_scope;
  const RunFn run = scope != nullptr && t_depth < kMaxDepth && actor != nullptr ? Resolve<RunFn>(actor, kRun) : nullptr;
  if (run == nullptr) {
    const PushFn push = Resolve<PushFn>(this, kPush);
    if (push == nullptr) {  // cannot happen while Lite calls this: the library that built the pool defines it
      std::fprintf(stderr, "msrl-lite: the thread pool's own ActorThreadPool::PushActorToQueue not found\n");
      std::abort();
    }
    push(this, actor);
    return;
  }
  struct Nested {
    Nested() { ++t_depth; }
    ~Nested() { --t_depth; }
  } nested;
  scope->Count();
  msrl::FloatMode mode(msrl::FloatMode::kFlushDenormals);  // as Lite's workers compute
  run(actor);
}

namespace msrl {

InlineScope::InlineScope(bool on) : on_(on) {
  if (!on_) return;
  outer_ = t_scope;
  t_scope = this;
}

InlineScope::~InlineScope() {
  if (on_) t_scope = outer_;
}

bool InlineDefault() { return MSRL_LITE_INLINE_DEFAULT != 0; }

bool InlineWanted() {
  const char *v = std::getenv("MSRL_LITE_INLINE");
  if (v != nullptr && std::strcmp(v, "1") == 0) return true;
  if (v != nullptr && std::strcmp(v, "0") == 0) return false;
  return InlineDefault();
}

}  // namespace msrl

extern "C" uint32_t msrl_lite_float_mode() { return msrl::FloatMode::Get(); }

extern "C" void msrl_lite_set_float_mode(uint32_t mode) { msrl::FloatMode::Set(mode); }
