//! The second trajectory generator: ten fact kinds that the first generator's five (paths,
//! compiler errors, settings, decisions, doc rules) do not cover, each planted among lines
//! of the same shape, as real tool output holds them: a request id in a JSON log, a
//! location in a Python traceback, a cell of a `psql` table, a pinned version in
//! `pip freeze`, a listening port in `ss -ltnp`, the owner of a `TODO`, an environment
//! variable, a commit in `git log`, the frame and cause of a Java exception, a field of a
//! JSON configuration. Nothing here was looked at when the digests were written: it exists
//! to see whether what they keep generalises. Same seed, same trajectory.

use std::fmt::Write as _;

use fastrand::Rng;

use super::{Fact, Kind, Trajectory, Turn};

/// Facts of each kind in one trajectory.
const PER_KIND: usize = 4;

const WORDS: [&str; 24] = [
    "ledger", "refund", "invoice", "payout", "tenant", "webhook", "quota", "session", "cursor",
    "export", "ingest", "audit", "report", "batch", "shard", "replica", "token", "schema",
    "policy", "notify", "billing", "search", "storage", "metric",
];
const PEOPLE: [&str; 12] = [
    "mirela", "tomasz", "ines", "kwame", "yuki", "aditi", "lars", "noor", "pablo", "sofia",
    "dmitri", "amara",
];
const PACKAGES: [&str; 40] = [
    "aiohttp",
    "anyio",
    "attrs",
    "boto3",
    "certifi",
    "charset-normalizer",
    "click",
    "cryptography",
    "fastapi",
    "greenlet",
    "h11",
    "httpcore",
    "httpx",
    "idna",
    "jinja2",
    "jmespath",
    "markupsafe",
    "msgpack",
    "numpy",
    "orjson",
    "packaging",
    "pandas",
    "pluggy",
    "psycopg",
    "pydantic",
    "pyjwt",
    "pytest",
    "python-dateutil",
    "pytz",
    "pyyaml",
    "redis",
    "requests",
    "rich",
    "s3transfer",
    "six",
    "sqlalchemy",
    "starlette",
    "tenacity",
    "urllib3",
    "uvicorn",
];
const DAEMONS: [&str; 10] = [
    "redis-server",
    "postgres",
    "nginx",
    "envoy",
    "memcached",
    "rabbitmq",
    "node",
    "gunicorn",
    "prometheus",
    "grafana",
];
const REGIONS: [&str; 10] = [
    "eu-west-1",
    "eu-west-2",
    "eu-central-1",
    "us-east-1",
    "us-east-2",
    "us-west-2",
    "ap-south-1",
    "ap-northeast-1",
    "sa-east-1",
    "ca-central-1",
];

/// The new kinds, in table order.
pub const KINDS: [Kind; 10] = [
    Kind::Identifier,
    Kind::StackLocation,
    Kind::TableCell,
    Kind::Version,
    Kind::Port,
    Kind::TodoOwner,
    Kind::EnvVar,
    Kind::Commit,
    Kind::JavaCause,
    Kind::JsonField,
];

fn pick<'a>(rng: &mut Rng, pool: &[&'a str]) -> &'a str {
    pool[rng.usize(..pool.len())]
}

fn hex(rng: &mut Rng, len: usize) -> String {
    (0..len)
        .map(|_| char::from(b"0123456789abcdef"[rng.usize(..16)]))
        .collect()
}

fn snake(rng: &mut Rng) -> String {
    format!("{}_{}", pick(rng, &WORDS), pick(rng, &WORDS))
}

fn camel(rng: &mut Rng) -> String {
    let word = pick(rng, &WORDS);
    let mut chars = word.chars();
    chars.next().map_or_else(String::new, |c| {
        c.to_ascii_uppercase().to_string() + chars.as_str()
    })
}

/// A planted fact's output, its needles, a statement, what the later turn says of it and
/// the recall query. `n` makes each planted value unique in the trajectory.
struct Planted {
    tool: &'static str,
    command: String,
    output: String,
    needles: Vec<String>,
    statement: String,
    reference: String,
    query: String,
}

/// `count` noise lines from `line`, with `fact` inserted at a random place.
fn among(
    rng: &mut Rng,
    count: usize,
    fact: String,
    mut line: impl FnMut(&mut Rng) -> String,
) -> String {
    let at = rng.usize(..count);
    let mut out = String::new();
    for i in 0..count {
        if i == at {
            let _ = writeln!(out, "{fact}");
        }
        let _ = writeln!(out, "{}", line(rng));
    }
    out
}

fn plant(rng: &mut Rng, kind: Kind, n: usize) -> Planted {
    let size = 30 + rng.usize(..90);
    match kind {
        Kind::Identifier => {
            let id = format!("req_{}{n:02}", hex(rng, 10));
            let route = format!("/v2/{}/{}", pick(rng, &WORDS), pick(rng, &WORDS));
            let fact = format!(
                r#"{{"level":"warn","ts":"2026-11-0{}T10:{:02}:{:02}Z","request_id":"{id}","route":"{route}","msg":"upstream reset","attempt":3}}"#,
                1 + n % 9,
                rng.usize(..60),
                rng.usize(..60)
            );
            let output = among(rng, size, fact, |rng| {
                format!(
                    r#"{{"level":"info","ts":"2026-11-04T10:{:02}:{:02}Z","request_id":"req_{}","route":"/v2/{}","msg":"ok","ms":{}}}"#,
                    rng.usize(..60),
                    rng.usize(..60),
                    hex(rng, 12),
                    pick(rng, &WORDS),
                    rng.usize(1..900)
                )
            });
            Planted {
                tool: "shell",
                command: format!("tail -n {size} /var/log/api/{}.jsonl", pick(rng, &WORDS)),
                output,
                needles: vec![id.clone()],
                statement: format!("The request that hit the upstream reset on {route} was {id}."),
                reference: format!(
                    "I need the id of the request that got the upstream reset on {route}."
                ),
                query: "upstream reset".into(),
            }
        }
        Kind::StackLocation => {
            let file = format!("app/{}/{}_{n}.py", pick(rng, &WORDS), pick(rng, &WORDS));
            let line = 40 + rng.usize(..600);
            let function = format!("apply_{}_{n}", pick(rng, &WORDS));
            let location = format!(r#"File "{file}", line {line}, in {function}"#);
            let mut output = String::from("Traceback (most recent call last):\n");
            for _ in 0..(3 + rng.usize(..8)) {
                let _ = writeln!(
                    output,
                    "  File \"/usr/lib/python3.12/site-packages/{}/{}.py\", line {}, in {}\n    return fn(*args, **kwargs)",
                    pick(rng, &PACKAGES),
                    pick(rng, &WORDS),
                    rng.usize(10..900),
                    snake(rng)
                );
            }
            let _ = writeln!(output, "  {location}\n    total = rows[0].amount / count");
            let _ = writeln!(output, "ZeroDivisionError: division by zero");
            let mut noise = among(rng, size, String::new(), |rng| {
                format!(
                    "DEBUG {} {} took {}ms",
                    snake(rng),
                    hex(rng, 6),
                    rng.usize(1..400)
                )
            });
            noise.push_str(&output);
            Planted {
                tool: "shell",
                command: format!("python -m app.jobs.{} --dry-run", pick(rng, &WORDS)),
                output: noise,
                needles: vec![format!("{file}\", line {line}")],
                statement: format!(
                    "The ZeroDivisionError is raised at {file}, line {line}, in {function}."
                ),
                reference: format!("Where exactly did {function} divide by zero?"),
                query: function,
            }
        }
        Kind::TableCell => {
            let region = REGIONS[n % REGIONS.len()];
            let replicas = 10 + n * 7 + rng.usize(..5);
            let lag = format!("{}.{:02}", rng.usize(..9), rng.usize(..100));
            let fact = format!(" {region:<14} | {replicas:>8} | {lag:>6} | tenant_{n:03}");
            let mut output = String::from(
                " region         | replicas | lag_s  | owner\n----------------+----------+--------+-----------\n",
            );
            output.push_str(&among(rng, size.min(60), fact, |rng| {
                format!(
                    " {:<14} | {:>8} | {:>6} | tenant_{}",
                    pick(rng, &REGIONS),
                    rng.usize(1..9),
                    format!("{}.{:02}", rng.usize(..9), rng.usize(..100)),
                    100 + rng.usize(..800)
                )
            }));
            let _ = writeln!(output, "({} rows)", size.min(60) + 1);
            Planted {
                tool: "shell",
                command: "psql -c 'select region, replicas, lag_s, owner from shard_map'".into(),
                output,
                needles: vec![format!("tenant_{n:03}"), format!("{replicas:>8}")],
                statement: format!(
                    "Shard map: tenant_{n:03} in {region} has {replicas} replicas (lag {lag} s)."
                ),
                reference: format!("How many replicas did the shard map give tenant_{n:03}?"),
                query: format!("tenant_{n:03}"),
            }
        }
        Kind::Version => {
            let package = PACKAGES[(n * 7) % PACKAGES.len()];
            let version = format!("{}.{}.{}", 1 + rng.usize(..4), rng.usize(..30), 100 + n);
            let fact = format!("{package}=={version}");
            let output = among(rng, size.min(70), fact, |rng| {
                format!(
                    "{}-{}=={}.{}.{}",
                    pick(rng, &WORDS),
                    pick(rng, &WORDS),
                    rng.usize(..9),
                    rng.usize(..40),
                    rng.usize(..20)
                )
            });
            Planted {
                tool: "shell",
                command: "pip freeze".into(),
                output,
                needles: vec![format!("{package}=={version}")],
                statement: format!("The environment pins {package}=={version}."),
                reference: format!("Which {package} version is installed here?"),
                query: package.into(),
            }
        }
        Kind::Port => {
            let daemon = DAEMONS[n % DAEMONS.len()];
            let port = 6_000 + n * 37 + rng.usize(..30);
            let fact = format!(
                "LISTEN 0      511        127.0.0.1:{port}      0.0.0.0:*    users:((\"{daemon}\",pid={},fd=6))",
                1_000 + rng.usize(..30_000)
            );
            let mut output = String::from(
                "State  Recv-Q Send-Q Local Address:Port  Peer Address:Port Process\n",
            );
            output.push_str(&among(rng, size.min(40), fact, |rng| {
                format!(
                    "LISTEN 0      128        0.0.0.0:{}      0.0.0.0:*    users:((\"{}\",pid={},fd={}))",
                    20_000 + rng.usize(..40_000),
                    pick(rng, &WORDS),
                    1_000 + rng.usize(..30_000),
                    rng.usize(3..40)
                )
            }));
            Planted {
                tool: "shell",
                command: "ss -ltnp".into(),
                output,
                needles: vec![format!("127.0.0.1:{port}"), daemon.into()],
                statement: format!("{daemon} listens on 127.0.0.1:{port}."),
                reference: format!("On which local port was {daemon} listening?"),
                query: daemon.into(),
            }
        }
        Kind::TodoOwner => {
            let owner = PEOPLE[n % PEOPLE.len()];
            let topic = format!("{}-{} fallback {n}", pick(rng, &WORDS), pick(rng, &WORDS));
            let fact = format!(
                "src/{}/{}.ts:{}:  // TODO({owner}): drop the {topic} once v3 ships",
                pick(rng, &WORDS),
                pick(rng, &WORDS),
                rng.usize(10..800)
            );
            let output = among(rng, size.min(50), fact, |rng| {
                format!(
                    "src/{}/{}.ts:{}:  // TODO({}): {} the {} {}",
                    pick(rng, &WORDS),
                    pick(rng, &WORDS),
                    rng.usize(10..800),
                    pick(rng, &PEOPLE),
                    pick(rng, &["rename", "split", "cache", "test", "document"]),
                    pick(rng, &WORDS),
                    pick(rng, &WORDS)
                )
            });
            Planted {
                tool: "shell",
                command: "rg -n 'TODO\\(' src".into(),
                output,
                needles: vec![format!("TODO({owner}): drop the {topic}")],
                statement: format!("TODO({owner}): drop the {topic} once v3 ships."),
                reference: format!("Who owns the TODO about the {topic}?"),
                query: topic.split(' ').next().unwrap_or_default().into(),
            }
        }
        Kind::EnvVar => {
            let name =
                format!("{}_{}_URL_{n}", pick(rng, &WORDS), pick(rng, &WORDS)).to_uppercase();
            let value = format!(
                "postgres://{}-{}.internal:{}/{}",
                pick(rng, &WORDS),
                1 + rng.usize(..9),
                5_400 + n,
                pick(rng, &WORDS)
            );
            let fact = format!("{name}={value}");
            let output = among(rng, size.min(60), fact, |rng| {
                let len = 8 + rng.usize(..16);
                format!(
                    "{}_{}={}",
                    pick(rng, &WORDS).to_uppercase(),
                    pick(rng, &WORDS).to_uppercase(),
                    hex(rng, len)
                )
            });
            Planted {
                tool: "shell",
                command: "env | sort".into(),
                output,
                needles: vec![value.clone()],
                statement: format!("{name} is {value}."),
                reference: format!("What is {name} set to?"),
                query: name,
            }
        }
        Kind::Commit => {
            let hash = hex(rng, 9);
            let subject = format!(
                "revert the {} {} batching ({n})",
                pick(rng, &WORDS),
                pick(rng, &WORDS)
            );
            let fact = format!("{hash} {subject}");
            let output = among(rng, size.min(80), fact, |rng| {
                format!(
                    "{} {} {} in {}",
                    hex(rng, 9),
                    pick(rng, &["fix", "add", "bump", "refactor", "test"]),
                    snake(rng),
                    pick(rng, &WORDS)
                )
            });
            Planted {
                tool: "shell",
                command: "git log --oneline -n 100".into(),
                output,
                needles: vec![hash.clone()],
                statement: format!("Commit {hash}: {subject}."),
                reference: format!("Which commit did the {subject}?"),
                query: "revert".into(),
            }
        }
        Kind::JavaCause => {
            let class = format!("{}{}", camel(rng), camel(rng));
            let line = 30 + rng.usize(..400);
            let cause = format!("period {} is closed for posting {n}", 2_020 + n);
            let mut output = among(rng, size.min(40), String::new(), |rng| {
                format!(
                    "2026-11-04 10:{:02}:{:02} INFO  [{}] c.a.{}.{} - handled in {} ms",
                    rng.usize(..60),
                    rng.usize(..60),
                    pick(rng, &WORDS),
                    pick(rng, &WORDS),
                    camel(rng),
                    rng.usize(1..300)
                )
            });
            let _ = writeln!(output, "java.lang.RuntimeException: posting failed");
            for _ in 0..(2 + rng.usize(..5)) {
                let _ = writeln!(
                    output,
                    "\tat org.springframework.{}.{}.invoke({}.java:{})",
                    pick(rng, &WORDS),
                    camel(rng),
                    camel(rng),
                    rng.usize(10..500)
                );
            }
            let _ = writeln!(
                output,
                "\tat com.acme.ledger.{class}.apply({class}.java:{line})"
            );
            let _ = writeln!(
                output,
                "Caused by: java.lang.IllegalStateException: {cause}"
            );
            let _ = writeln!(output, "\t... {} more", rng.usize(5..40));
            Planted {
                tool: "shell",
                command: "kubectl logs deploy/ledger --tail 200".into(),
                output,
                needles: vec![format!("{class}.java:{line}"), cause.clone()],
                statement: format!(
                    "The posting failed at {class}.java:{line}: IllegalStateException: {cause}."
                ),
                reference: format!(
                    "What caused the posting failure in {class}, and on which line?"
                ),
                query: class,
            }
        }
        Kind::JsonField => {
            let key = format!("{}_budget_ms_{n}", pick(rng, &WORDS));
            let value = 1_000 + n * 250 + rng.usize(..200);
            let fact = format!("    \"{key}\": {value},");
            let mut output = String::from("{\n  \"service\": {\n");
            output.push_str(&among(rng, size.min(70), fact, |rng| {
                format!("    \"{}\": {},", snake(rng), rng.usize(..5_000))
            }));
            output.push_str("    \"version\": 3\n  }\n}\n");
            Planted {
                tool: "read_file",
                command: format!("config/{}.json", pick(rng, &WORDS)),
                output,
                needles: vec![format!("\"{key}\": {value}")],
                statement: format!("The configuration sets \"{key}\": {value}."),
                reference: format!("What value does the configuration give {key}?"),
                query: key,
            }
        }
        Kind::Path | Kind::Error | Kind::Number | Kind::Decision | Kind::Constraint => {
            unreachable!("the first generator's kinds")
        }
    }
}

/// An ordinary output between the planted ones: a listing, a passing build, a file read.
fn noise(rng: &mut Rng) -> (&'static str, String, String) {
    let lines = 20 + rng.usize(..160);
    match rng.usize(..3) {
        0 => {
            let output = (0..lines)
                .map(|_| format!("src/{}/{}.ts", pick(rng, &WORDS), snake(rng)))
                .collect::<Vec<_>>()
                .join("\n");
            ("shell", "find src -name '*.ts'".to_owned(), output)
        }
        1 => {
            let output = (0..lines)
                .map(|_| {
                    format!(
                        "PASS tests/{}/{}.test.ts ({} ms)",
                        pick(rng, &WORDS),
                        snake(rng),
                        rng.usize(3..900)
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            ("shell", "npm test".to_owned(), output)
        }
        _ => {
            let output = (0..lines)
                .map(|i| {
                    format!(
                        "{i:>4}  export function {}({}: {}) {{ return {}; }}",
                        snake(rng),
                        pick(rng, &WORDS),
                        camel(rng),
                        pick(rng, &WORDS)
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            (
                "read_file",
                format!("src/{}/{}.ts", pick(rng, &WORDS), pick(rng, &WORDS)),
                output,
            )
        }
    }
}

/// A trajectory of 84 to 129 turns with four facts of each of the ten kinds.
pub fn generate(seed: u64) -> Trajectory {
    let mut rng = Rng::with_seed(seed ^ 0x5ec0_d000);
    let turns = 84 + rng.usize(..46);
    // Plant turns: spread over the first three quarters, one fact per turn.
    let mut slots: Vec<usize> = (2..turns * 3 / 4).collect();
    rng.shuffle(&mut slots);
    let mut facts: Vec<(Fact, Planted)> = Vec::new();
    let mut n = 0;
    for kind in KINDS {
        for _ in 0..PER_KIND {
            n += 1;
            let planted_at = slots.pop().unwrap_or(2);
            let needed = (planted_at + 4 + rng.usize(..57)).min(turns);
            let planted = plant(&mut rng, kind, n);
            let fact = Fact {
                kind,
                needles: planted.needles.clone(),
                statement: planted.statement.clone(),
                query: planted.query.clone(),
                planted: planted_at,
                needed,
                restated: rng.f64() < 0.3,
            };
            facts.push((fact, planted));
        }
    }
    let mut out = Vec::with_capacity(turns);
    for t in 1..=turns {
        let mut text = format!("Step {t}: ");
        if let Some((fact, _)) = facts.iter().find(|(f, _)| f.restated && f.planted + 1 == t) {
            let _ = write!(text, "Noted: {} ", fact.statement);
        }
        for (fact, planted) in facts.iter().filter(|(f, _)| f.needed == t) {
            let _ = write!(text, "{} ", planted.reference);
            debug_assert!(!fact.is_in(&text));
        }
        text.push_str("Next I look at what the tool shows.");
        let call_id = format!("s{t}");
        let (tool, command, output) = match facts.iter().find(|(f, _)| f.planted == t) {
            Some((_, planted)) => (
                planted.tool,
                planted.command.clone(),
                planted.output.clone(),
            ),
            None => noise(&mut rng),
        };
        let arguments = if tool == "read_file" {
            serde_json::json!({ "path": command })
        } else {
            serde_json::json!({ "command": command })
        };
        out.push(Turn {
            text,
            call_id,
            tool,
            arguments,
            output,
            is_error: false,
        });
    }
    Trajectory {
        seed,
        task: "Find why the nightly ledger export fails and fix it without breaking the API."
            .into(),
        turns: out,
        final_answer: "The export is fixed.".into(),
        facts: facts.into_iter().map(|(fact, _)| fact).collect(),
    }
}
