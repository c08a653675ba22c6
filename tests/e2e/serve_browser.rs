//! The web view in a real browser: Debian's `chromium`, headless, driven through Debian's
//! `chromium-driver` (WebDriver) with fantoccini. A person with an `approve` token logs in,
//! starts a scripted execution from the page, watches its events arrive, approves the call
//! its ask rule parked, and sees the diff; a second browser with a `read` token sees all of
//! it and no Approve button; logging out ends the session for good.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use crate::parked::ASK_BEFORE_SED;
use crate::serve::{raw_request, serve_scripted, slowed_demo, token};
use crate::support::{PATIENCE, copy_example, docker_available};

/// The whole test's limit: a run in the sandbox, two browsers, and their pages.
const LIMIT: Duration = Duration::from_secs(600);

/// Whether chromium and chromedriver are installed. Panics when they must be
/// (`NERVE_REQUIRE_DOCKER=1`, as under `cargo xtask ci`, which installs them).
fn browser_available() -> bool {
    let found = |program: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {program}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if found("chromium") && found("chromedriver") {
        return true;
    }
    let reason = "the browser test needs Debian's chromium and chromium-driver (`cargo xtask ci` installs them)";
    assert!(
        !std::env::var("NERVE_REQUIRE_DOCKER").is_ok_and(|v| v == "1"),
        "{reason} (required: NERVE_REQUIRE_DOCKER=1)"
    );
    eprintln!("skipping: {reason}");
    false
}

/// A running chromedriver on a free loopback port, killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Self {
        let port = crate::phoenix::free_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + PATIENCE;
        // Ends: once chromedriver accepts a connection, or at the deadline (a failure).
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// A new headless browser with a profile of its own in `profile`.
    async fn browser(&self, profile: &Path) -> Client {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new",
                    // As root in a container: Chromium's own sandbox cannot start.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    // Offline: anything but the loopback (which bypasses a proxy) fails.
                    "--proxy-server=127.0.0.1:9",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .unwrap()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `condition` to give a value, polling; panics with `what` at the deadline.
async fn eventually<T, F, Fut>(what: &str, mut condition: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    // Ends: when the condition holds, or at the deadline (a failure).
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The page's text (what a person reads); empty while a page is loading.
async fn text(browser: &Client) -> String {
    match browser.find(Locator::Css("main")).await {
        Ok(main) => main.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// How many live event items the page shows now.
async fn live_items(browser: &Client) -> usize {
    browser
        .find_all(Locator::Css("#live li.event"))
        .await
        .map_or(0, |items| items.len())
}

async fn log_in(browser: &Client, base: &str, token: &str) {
    browser.goto(base).await.unwrap();
    let input = browser
        .find(Locator::Css("input[name=token]"))
        .await
        .unwrap();
    input.send_keys(token).await.unwrap();
    browser
        .find(Locator::Css("form[action='/login'] button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    eventually("the executions after logging in", || async {
        text(browser).await.contains("Executions").then_some(())
    })
    .await;
}

#[test]
fn a_person_starts_watches_approves_and_logs_out_in_a_real_browser() {
    if !docker_available() || !browser_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let workspace = copy_example("demo", dir.path());
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, ASK_BEFORE_SED).unwrap();
    let provider = format!("script:{}", slowed_demo(dir.path(), 1000).display());
    let approver = token(&db, "approver", "approve");
    let reader = token(&db, "reader", "read");
    let served = serve_scripted(
        &db,
        dir.path(),
        &provider,
        &["--config", config.to_str().unwrap()],
    );
    let addr = served.addr.clone();
    let base = format!("http://{addr}/");
    let driver = Driver::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        tokio::time::timeout(LIMIT, async {
            let person = driver.browser(&dir.path().join("profile-approver")).await;
            let viewer = driver.browser(&dir.path().join("profile-reader")).await;
            log_in(&person, &base, &approver).await;

            // Start an execution from the page.
            person
                .find(Locator::Css("#workspace"))
                .await
                .unwrap()
                .send_keys(workspace.to_str().unwrap())
                .await
                .unwrap();
            person
                .find(Locator::Css("#task"))
                .await
                .unwrap()
                .send_keys("fix greet.sh")
                .await
                .unwrap();
            person
                .find(Locator::Css("form#start button"))
                .await
                .unwrap()
                .click()
                .await
                .unwrap();
            let url = eventually("the execution's page", || async {
                let url = person.current_url().await.ok()?;
                url.path().starts_with("/executions/").then_some(url)
            })
            .await;
            let id = url.path().trim_start_matches("/executions/").to_owned();

            // Its events arrive on the open page, one after another.
            let first = eventually("a first live event", || async {
                let n = live_items(&person).await;
                (n > 0).then_some(n)
            })
            .await;
            eventually("more live events on the same page", || async {
                (live_items(&person).await > first).then_some(())
            })
            .await;
            let kinds: Vec<String> = {
                let mut kinds = Vec::new();
                for item in person
                    .find_all(Locator::Css("#live li.event"))
                    .await
                    .unwrap()
                {
                    kinds.extend(item.attr("data-kind").await.unwrap());
                }
                kinds
            };
            assert!(
                kinds
                    .iter()
                    .any(|k| k == "tool_call_started" || k == "message_appended"),
                "{kinds:?}"
            );

            // The ask rule parks it: the page shows the call with an Approve button.
            let approve = eventually("the Approve button", || async {
                person.find(Locator::Css("button[value=allow]")).await.ok()
            })
            .await;
            let page = text(&person).await;
            assert!(page.contains("parked") && page.contains("sed -i"), "{page}");

            // The reader sees the same, and no button.
            viewer.goto(&base).await.unwrap();
            log_in(&viewer, &base, &reader).await;
            viewer
                .goto(&format!("{base}executions/{id}"))
                .await
                .unwrap();
            let seen = text(&viewer).await;
            assert!(
                seen.contains("Waiting for a decision") && seen.contains("sed -i"),
                "{seen}"
            );
            assert!(
                viewer
                    .find_all(Locator::Css("button[value=allow], button[value=deny]"))
                    .await
                    .unwrap()
                    .is_empty(),
                "a read token got a decision button"
            );
            assert!(seen.contains("scope approve"), "{seen}");

            // Approved: the call runs, the execution completes, the diff shows the edit.
            approve.click().await.unwrap();
            eventually("the completed execution", || async {
                let state = person.find(Locator::Css("dd.state")).await.ok()?;
                (state.text().await.ok()? == "completed").then_some(())
            })
            .await;
            let diff = person
                .find(Locator::Css("pre.diff"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            assert!(
                diff.contains("+echo \"Hello, Nerve!\"") || diff.contains("Hello, Nerve!"),
                "{diff}"
            );
            let page = text(&person).await;
            for shown in ["Cost", "Context fill", "Replay", "100% complete", "No gaps"] {
                assert!(page.contains(shown), "{shown}: {page}");
            }
            // The reader sees the result too.
            viewer.refresh().await.unwrap();
            let seen = text(&viewer).await;
            assert!(
                seen.contains("completed") && seen.contains("Hello, Nerve!"),
                "{seen}"
            );

            // Logging out ends the session: the browser is back at the login form, and a
            // copy of its cookie is refused.
            let kept = person.get_named_cookie("nerve_session").await.unwrap();
            let kept = format!("nerve_session={}", kept.value());
            person.goto(&base).await.unwrap();
            person
                .find(Locator::Css("form[action='/logout'] button"))
                .await
                .unwrap()
                .click()
                .await
                .unwrap();
            eventually("the login form after logging out", || async {
                person.find(Locator::Css("input[name=token]")).await.ok()
            })
            .await;
            person
                .goto(&format!("{base}executions/{id}"))
                .await
                .unwrap();
            assert!(person.find(Locator::Css("input[name=token]")).await.is_ok());
            let (status, _, page) =
                raw_request(&addr, "GET", "/", &[("Cookie", kept.as_str())], None);
            assert_eq!(status, 401, "{page}");
            person.close().await.unwrap();
            viewer.close().await.unwrap();
        })
        .await
        .expect("the browser test took too long");
    });
    assert!(
        std::fs::read_to_string(workspace.join("greet.sh"))
            .unwrap()
            .contains("Hello, Nerve!")
    );
}
