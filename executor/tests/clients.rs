//! `memra-run serve` driven by real clients: starts the built server on the CPU backend with
//! SmolLM2 and runs `scripts/client-tests.sh` against it, which installs the `openai` Python
//! package into a git-ignored virtualenv and checks completions, chat, streaming, concurrent
//! requests, a closed stream, the sampling fields, logprobs, n, a JSON schema, tools, the API
//! key (the server reads it from a file), the connection cap, the timeouts, prompts past the
//! context refused without the server's memory growing, the allowed and a foreign web origin,
//! the bad requests with it and with curl (`scripts/client_tests.py`), and last SIGTERM
//! during a stream, after which the server must exit 0. Fails, with the script's output and
//! the server's log, when the script fails, python3 or its venv module or curl included: CI
//! must have them.

mod common;

use std::process::Command;

use common::{root, ServeProcess};

/// The server's --api-key, which the clients send.
const KEY: &str = "sk-memra-clients";

#[test]
fn the_openai_package_and_curl_get_their_answers() {
    // the key from a file, as a deployment keeps it out of the process list
    let key_file = std::env::temp_dir().join(format!("memra-clients-key-{}", std::process::id()));
    std::fs::write(&key_file, format!("{KEY}\n")).unwrap();
    // Two kernel threads: cargo runs test binaries one at a time, and this one has one test.
    let mut server = ServeProcess::start_with(
        2,
        &[
            "--api-key-file",
            key_file.to_str().unwrap(),
            // the constants of scripts/client_tests.py
            "--timeout",
            "4",
            "--max-connections",
            "24",
            "--allowed-origins",
            "http://app.example",
            "--shutdown-grace",
            "0.5",
        ],
    );
    std::fs::remove_file(&key_file).unwrap();
    let port = server.port;

    let out = Command::new("bash")
        .current_dir(root())
        .arg("scripts/client-tests.sh")
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(KEY)
        .arg(server.pid().to_string())
        .output()
        .expect("running bash scripts/client-tests.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/client-tests.sh failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        server.log.lock().unwrap().join("\n")
    );
    println!("{stdout}{stderr}");
    // the last check sent SIGTERM during a stream
    let status = server.exit_within(std::time::Duration::from_secs(15));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{status:?}\nserver log:\n{}",
        server.log.lock().unwrap().join("\n")
    );
}
