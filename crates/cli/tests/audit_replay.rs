//! `runcell audit replay`: a session recorded by `runcell ask` (a scripted provider) re-run in
//! a fresh sandbox, cell by cell. A deterministic session matches throughout; in one that
//! draws unseeded random numbers exactly those cells differ, with the source named.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use runcell_agent::testing::StandIn;
use serde_json::{json, Value};

fn data_dir() -> PathBuf {
    runcell_engine::testing::data_dir_with_runtime(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "runcell-replay-test-",
    )
}

fn runcell(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runcell"));
    c.env("RUNCELL_DATA_DIR", data)
        .env("NO_COLOR", "1")
        .env_remove("OPENAI_API_KEY")
        .env_remove("RUNCELL_PROVIDER")
        .env_remove("RUNCELL_MODEL");
    c
}

/// Records a session through `runcell ask` whose model runs `cells` in order, with `file`
/// uploaded; returns its id.
fn record(data: &Path, work: &Path, file: &Path, cells: &'static [&'static str]) -> String {
    let stand_in = StandIn::start(move |n, _| {
        let body = match cells.get(n) {
            Some(code) => json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": null, "tool_calls": [{
                    "id": format!("call_{n}"), "type": "function",
                    "function": {"name": "python", "arguments": json!({"code": code}).to_string()}}]}}]}),
            None => json!({"choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "done"}}]}),
        };
        (200, vec![], body.to_string())
    });
    let out = runcell(data)
        .env("OPENAI_API_KEY", "sk-test")
        .args(["ask", "Analyse it", "--provider", "openai", "--model", "m"])
        .arg("--base-url")
        .arg(format!("{}/v1", stand_in.base))
        .arg("--file")
        .arg(file)
        .arg("--out")
        .arg(work.join("out"))
        .output()
        .expect("ask");
    assert!(out.status.success(), "{out:?}");
    let list = runcell(data)
        .args(["audit", "list", "--limit", "1"])
        .output()
        .expect("audit list");
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    list.split_whitespace()
        .nth(4)
        .expect("session id")
        .to_owned()
}

fn replay(data: &Path, session: &str, file: &Path) -> (Output, Value) {
    let out = runcell(data)
        .args(["audit", "replay", session, "--json", "--file"])
        .arg(file)
        .output()
        .expect("replay");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    (out, report)
}

const DETERMINISTIC: &[&str] = &[
    "import pandas as pd\ndf = pd.read_csv('data.csv')\ntotal = int(df['n'].sum())\nprint('TOTAL', total)",
    "df.assign(twice=df['n'] * 2).to_csv('twice.csv', index=False)\ntotal * 2",
    "import numpy as np\nnp.random.seed(7)\nprint(np.random.randint(0, 10**9))",
    "1 / 0",
];

const UNSEEDED: &[&str] = &[
    "x = sum(range(100))\nprint(x)",
    "import random\nprint(random.random())",
    "print(x + 1)",
    "import numpy as np\nprint(np.random.rand(3).tolist())",
];

#[test]
fn a_deterministic_session_replays_cell_for_cell_and_an_unseeded_one_shows_which_cells_differ() {
    let data = data_dir();
    let work = tempfile::tempdir().expect("tempdir");
    let csv = work.path().join("data.csv");
    std::fs::write(&csv, "n\n1\n2\n3\n39\n").expect("csv");

    let session = record(&data, work.path(), &csv, DETERMINISTIC);
    let (out, report) = replay(&data, &session, &csv);
    assert!(out.status.success(), "{out:?}\n{report:#}");
    assert_eq!(report["session_id"], session.as_str());
    assert_eq!(report["matched"], 4, "{report:#}");
    assert_eq!(report["differed"], 0);
    let cells = report["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 4);
    for (i, c) in cells.iter().enumerate() {
        assert_eq!(c["index"], i + 1);
        assert_eq!(c["code"], DETERMINISTIC[i]);
        for check in ["stdout", "result", "error", "files"] {
            assert_eq!(c[check]["matches"], true, "cell {} {check}: {c:#}", i + 1);
        }
    }
    // The produced file's hash, from the replayed workspace.
    let twice = cells[1]["replayed_sha256"]["twice.csv"]
        .as_str()
        .expect("hash");
    assert_eq!(twice.len(), 64);
    assert_eq!(report["uploads"][0]["path"], "data.csv");
    assert_eq!(report["uploads"][0]["restored"], true);

    // The table says the same, for a person.
    let table = runcell(&data)
        .args(["audit", "replay", &session, "--file"])
        .arg(&csv)
        .output()
        .expect("replay table");
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains("4 of 4 cells match, 0 differ"), "{table}");

    let session = record(&data, work.path(), &csv, UNSEEDED);
    let (out, report) = replay(&data, &session, &csv);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let cells = report["cells"].as_array().expect("cells");
    let differing: Vec<u64> = cells
        .iter()
        .filter(|c| c["matches"] == false)
        .map(|c| c["index"].as_u64().expect("index"))
        .collect();
    assert_eq!(differing, [2, 4], "{report:#}");
    assert_eq!(report["differed"], 2);
    assert_eq!(
        cells[1]["sources_of_difference"],
        json!(["the random module without random.seed()"])
    );
    assert_eq!(
        cells[3]["sources_of_difference"],
        json!(["numpy random numbers without a seed"])
    );
    assert_eq!(cells[1]["stdout"]["matches"], false);
    assert!(cells[1]["stdout"]["diff"]
        .as_str()
        .expect("diff")
        .starts_with("--- recorded\n+++ replayed\n"));
    assert_eq!(cells[0]["sources_of_difference"], json!([]));

    let table = runcell(&data)
        .args(["audit", "replay", &session, "--file"])
        .arg(&csv)
        .output()
        .expect("replay table");
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains("2 of 4 cells match, 2 differ"), "{table}");
    assert!(
        table.contains("cell 2 differs") && table.contains("random.seed()"),
        "{table}"
    );

    let verify = runcell(&data)
        .args(["audit", "verify"])
        .output()
        .expect("verify");
    assert!(verify.status.success(), "{verify:?}");
}
