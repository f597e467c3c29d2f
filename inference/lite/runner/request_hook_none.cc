#include "request_hook.h"

namespace msrl {

RequestHook MakeRequestHook() { return nullptr; }

}  // namespace msrl
