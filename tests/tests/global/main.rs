//! The integration tests that set process-wide state: the installed default handle
//! (`install`) and the global `metrics` recorder (`acl`, `rate_faults`). They cannot share
//! a process with the rest (`tests/it/`), where no test installs either.

mod acl;
mod disabled_commands;
mod install;
mod rate_faults;
