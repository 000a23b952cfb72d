// Linked into the sanitizer build of the module only
// (scripts/build-module.sh --sanitize), next to a static libubsan.
//
// UndefinedBehaviorSanitizer reads UBSAN_OPTIONS when it initializes, and
// in a shared object it does that only at its first report: in an nginx
// worker, whose environment nginx has emptied and whose original environment
// block (what the sanitizer reads, /proc/self/environ) now holds the process
// title.  Its log_path, print_stacktrace and halt_on_error would be lost.
// Initializing it when the module is loaded, in the master, reads them while
// the environment is still there; the workers are forked with it.

namespace __ubsan {
void InitAsStandalone();
}

__attribute__((constructor)) static void affinity_ubsan_init()
{
    __ubsan::InitAsStandalone();
}
