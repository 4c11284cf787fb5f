//! `memra-run`: executes memra execution plans (see `memra-run --help`).

fn main() -> std::process::ExitCode {
    memra_executor::cli::main()
}
