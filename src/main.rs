fn main() -> std::process::ExitCode {
    walrus::cli::main()
}
