//! `memra-run`: executes memra execution plans (see `memra-run --help`).

fn main() -> std::process::ExitCode {
    memra_gguf::progress::report_to_stderr();
    memra_executor::cli::main()
}
