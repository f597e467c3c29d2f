// A hook the server calls once per infer request, after reading it (rows = the first input's batch size).
//
// The shipped msrl-lite-runner links request_hook_none.cc (no hook: nothing a user's environment can trigger);
// only the test binary msrl-lite-runner-test links request_hook_fault.cc, whose hook hangs or crashes on demand
// so the client's timeout, crash and restart paths can be tested.
#pragma once

#include <cstdint>

namespace msrl {

using RequestHook = void (*)(uint64_t rows);

// nullptr in the shipped runner.
RequestHook MakeRequestHook();

}  // namespace msrl
