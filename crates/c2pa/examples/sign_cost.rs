//! The time to sign images as `runcell serve` does (bench/c2pa.sh): for each IMAGE given,
//! the median of N signatures, the bytes the manifest adds, and a check that the copy reads
//! back as Trusted.
//!
//! cargo run --release -p runcell-c2pa --example sign_cost -- N IMAGE...

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(50);
    let creds =
        runcell_c2pa::Credentials::from_secrets([7; 32], [8; 32], "bench").expect("credentials");
    let origin = runcell_c2pa::Origin {
        execution_id: "ex_bench".into(),
        session_id: Some("ses_bench".into()),
        tenant: "default".into(),
        code_sha256: "00".repeat(32),
        time: "2026-12-01T00:00:00.000Z".into(),
        path: None,
        source_sha256: None,
    };
    for path in args {
        let image = std::fs::read(&path).expect("read the image");
        let mime = if path.ends_with(".png") {
            "image/png"
        } else {
            "image/jpeg"
        };
        let mut times = Vec::with_capacity(n);
        let mut signed = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            signed = creds.sign(mime, &image, &origin).expect("sign");
            times.push(t.elapsed());
        }
        times.sort();
        let report = runcell_c2pa::read(mime, &signed, Some(creds.ca_pem()))
            .expect("read")
            .expect("a manifest");
        assert_eq!(report.state, "Trusted", "{report:?}");
        println!(
            "{path}\t{} bytes\tsign median {:.2} ms\tp90 {:.2} ms\t+{} bytes",
            image.len(),
            times[n / 2].as_secs_f64() * 1e3,
            times[n * 9 / 10].as_secs_f64() * 1e3,
            signed.len() - image.len()
        );
    }
}
