//! The token estimate against the real tokenizers: per-message relative error (p50, p95,
//! mean signed bias) on code, JSON, logs and prose, next to the naive four-bytes-per-token
//! rule; then the least-squares refit of the estimate's weights on the same samples.
//!
//! `cargo run -p nerve-brain --release --example token_estimate`

#![allow(clippy::print_stdout)] // A report for a person: printing is its job.
#![allow(clippy::cast_precision_loss)] // Counts far below 2^52.
#![allow(clippy::needless_range_loop)] // Matrix arithmetic reads best with indices.

#[path = "../benches/corpus/mod.rs"]
mod corpus;

use nerve_brain::TokenCounter;
use nerve_brain::provider::tokens::{Encoding, Estimate, Features, Tiktoken};

struct Row {
    kind: &'static str,
    features: [f64; 10],
    truth: f64,
    bytes: f64,
}

fn features(text: &str) -> [f64; 10] {
    let f = Features::of(text);
    [
        f.words,
        f.long_letters,
        f.humps,
        f.digit_groups,
        f.punctuation,
        f.line_breaks,
        f.space_runs,
        f.wide2,
        f.wide3,
        f.wide4,
    ]
    .map(f64::from)
}

/// `p`-th percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round();
    // Rank within 0..len by construction.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let index = rank as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn summary(errors: &mut [f64]) -> String {
    let bias = errors.iter().sum::<f64>() / errors.len() as f64;
    let mut absolute: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
    absolute.sort_by(f64::total_cmp);
    errors.sort_by(f64::total_cmp);
    format!(
        "{:>6.1}% {:>6.1}% {:>+7.1}%",
        100.0 * percentile(&absolute, 50.0),
        100.0 * percentile(&absolute, 95.0),
        100.0 * bias
    )
}

/// Weights of the non-ASCII features, fixed by hand: the corpus has too few such characters
/// to fit them (2-byte letters such as `é` or Cyrillic, 3-byte CJK and symbols, emoji).
const FIXED_WIDE: [f64; 3] = [0.7, 1.5, 2.0];

/// Weighted least squares minimising the squared *relative* error, by normal equations,
/// over the seven ASCII features.
fn fit(rows: &[Row]) -> [f64; 10] {
    const N: usize = 7;
    let mut a = [[0.0_f64; N + 1]; N];
    for row in rows {
        let scale = 1.0 / row.truth.max(1.0);
        let fixed: f64 = row.features[N..]
            .iter()
            .zip(FIXED_WIDE)
            .map(|(f, w)| f * w)
            .sum();
        let target = row.truth - fixed;
        for i in 0..N {
            for j in 0..N {
                a[i][j] += row.features[i] * row.features[j] * scale * scale;
            }
            a[i][N] += row.features[i] * target * scale * scale;
        }
    }
    // A little ridge keeps features absent from the corpus (wide4) at a sane value.
    for (i, line) in a.iter_mut().enumerate() {
        line[i] += 1e-3;
    }
    for col in 0..N {
        let pivot = (col..N)
            .max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))
            .unwrap_or(col);
        a.swap(col, pivot);
        let p = a[col][col];
        if p.abs() < 1e-12 {
            continue;
        }
        for k in col..=N {
            a[col][k] /= p;
        }
        for r in 0..N {
            if r != col {
                let factor = a[r][col];
                for k in col..=N {
                    a[r][k] -= factor * a[col][k];
                }
            }
        }
    }
    let mut weights = [0.0; 10];
    for (i, w) in weights.iter_mut().take(N).enumerate() {
        *w = a[i][N];
    }
    weights[N..].copy_from_slice(&FIXED_WIDE);
    weights
}

fn main() {
    let cl100k = Tiktoken::new(Encoding::Cl100kBase);
    let o200k = Tiktoken::new(Encoding::O200kBase);
    println!("per-message relative error |estimate - real| / real: p50, p95, mean signed bias\n");
    println!(
        "{:<6} {:>5} {:>8}  {:^24}  {:^24}  {:^24}",
        "kind", "msgs", "KiB", "estimate vs cl100k", "estimate vs o200k", "bytes/4 vs cl100k"
    );
    let mut all = Vec::new();
    for kind in corpus::KINDS {
        let samples = corpus::samples(kind);
        let (mut vs_cl, mut vs_o, mut naive) = (Vec::new(), Vec::new(), Vec::new());
        let mut bytes = 0;
        for text in &samples {
            let truth = cl100k.count_text(text) as f64;
            if truth < 1.0 {
                continue;
            }
            let estimate = Estimate.count_text(text) as f64;
            let truth_o = o200k.count_text(text) as f64;
            vs_cl.push((estimate - truth) / truth);
            vs_o.push((estimate - truth_o) / truth_o);
            naive.push((text.len() as f64 / 4.0 - truth) / truth);
            bytes += text.len();
            all.push(Row {
                kind,
                features: features(text),
                truth,
                bytes: text.len() as f64,
            });
        }
        println!(
            "{kind:<6} {:>5} {:>8}  {}  {}  {}",
            vs_cl.len(),
            bytes / 1024,
            summary(&mut vs_cl),
            summary(&mut vs_o),
            summary(&mut naive)
        );
    }
    let weights = fit(&all);
    let bytes: f64 = all.iter().map(|r| r.bytes).sum();
    let tokens: f64 = all.iter().map(|r| r.truth).sum();
    println!(
        "\ncorpus: {} messages, {:.0} KiB, {:.2} bytes per cl100k token",
        all.len(),
        bytes / 1024.0,
        bytes / tokens
    );
    println!(
        "refit weights (words, long_letters, humps, digit_groups, punctuation, line_breaks, space_runs, wide2, wide3, wide4):"
    );
    println!(
        "[{}]",
        weights
            .iter()
            .map(|w| format!("{w:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // Does the fit generalise? Fit on half the messages (pairs alternate, so pretty and
    // compact JSON land on both sides), measure on the other half.
    let (train, test): (Vec<_>, Vec<_>) = all.iter().enumerate().partition(|(i, _)| i % 4 < 2);
    let train: Vec<Row> = train
        .into_iter()
        .map(|(_, r): (usize, &Row)| Row {
            kind: r.kind,
            features: r.features,
            truth: r.truth,
            bytes: r.bytes,
        })
        .collect();
    let held = fit(&train);
    println!("\nheld out (fit on one half, error on the other, vs cl100k): p50, p95, bias");
    for kind in corpus::KINDS {
        let mut errors: Vec<f64> = test
            .iter()
            .filter(|(_, r)| r.kind == kind)
            .map(|(_, r)| {
                let estimate: f64 = r
                    .features
                    .iter()
                    .zip(held)
                    .map(|(f, w)| f * w)
                    .sum::<f64>()
                    .ceil();
                (estimate - r.truth) / r.truth
            })
            .collect();
        println!("{kind:<6} {:>5}  {}", errors.len(), summary(&mut errors));
    }
}
