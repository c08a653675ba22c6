//! Redactor throughput on event-sized text, with and without secrets in it.

use divan::counter::BytesCount;
use divan::{Bencher, black_box};
use nerve_core::Redactor;
use secrecy::SecretString;

fn main() {
    divan::main();
}

/// About 1 MiB of tool-output-like text: log lines, JSON and code.
fn corpus(with_secrets: bool) -> String {
    let mut text = String::with_capacity(1 << 20);
    let mut i = 0u32;
    while text.len() < (1 << 20) {
        text.push_str(&format!(
            "2026-11-22T00:00:{:02}Z INFO request id={i} path=/api/v1/items/{i} status=200 took={}ms\n",
            i % 60,
            i % 97
        ));
        text.push_str(&format!(
            "{{\"item\":{i},\"name\":\"widget-{i}\",\"tags\":[\"a\",\"b\"]}}\n"
        ));
        text.push_str("    fn handle(&self, req: Request) -> Result<Response, Error> { todo_list.push(req) }\n");
        if with_secrets && i.is_multiple_of(50) {
            text.push_str(
                "export GITHUB_TOKEN=ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789 canary-0123456789\n",
            );
        }
        i += 1;
    }
    text
}

#[divan::bench(args = [false, true])]
fn well_known_formats(bencher: Bencher, with_secrets: bool) {
    let text = corpus(with_secrets);
    let redactor = Redactor::new();
    bencher
        .counter(BytesCount::of_str(&text))
        .bench(|| redactor.redact(black_box(&text)).len());
}

#[divan::bench(args = [false, true])]
fn with_registered_secrets(bencher: Bencher, with_secrets: bool) {
    let text = corpus(with_secrets);
    let secrets: Vec<(String, SecretString)> = (0..16)
        .map(|i| {
            (
                format!("rule{i}"),
                SecretString::from(format!("canary-{i:010}")),
            )
        })
        .collect();
    let redactor = Redactor::with_secrets(
        secrets
            .iter()
            .map(|(label, secret)| (label.as_str(), secret)),
    )
    .unwrap_or_default();
    bencher
        .counter(BytesCount::of_str(&text))
        .bench(|| redactor.redact(black_box(&text)).len());
}
