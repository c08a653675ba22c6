//! The fleet page against a real PostgreSQL log (a throwaway cluster, or `NERVE_TEST_PG`):
//! tasks submitted to the queue, one claimed by a worker that says it is alive, then
//! stopped, each seen on the page as a logged-in reader gets it. The server's tokens live in
//! a SQLite file here (tokens on a PostgreSQL log are another change): the page reads the
//! log the server was given, which is all this test is about.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use nerve_core::{ExecutionId, Redactor};
use nerve_runtime::config::Config;
use nerve_runtime::tokens::Scope;
use nerve_session::PgStore;
use tower::ServiceExt as _;

use crate::app::App;

/// The server's state on the PostgreSQL log at `url`, with its tokens in `tokens`; a
/// session cookie of a `read` token.
async fn app(url: &str, tokens: &Path) -> (Arc<App>, String) {
    let token = nerve_runtime::tokens::create(tokens, "reader", Scope::Read)
        .await
        .unwrap();
    let db: &'static Path = Box::leak(Path::new(url).to_path_buf().into_boxed_path());
    let app = Arc::new(App {
        db,
        config: Box::leak(Box::new(Config::default())),
        settings: crate::test_settings(),
        tokens: nerve_runtime::tokens::open(tokens).await.unwrap(),
        redactor: Arc::new(Redactor::new()),
        runs: crate::runs::Runs::default(),
        sessions: crate::sessions::Sessions::default(),
        stopping: tokio_util::sync::CancellationToken::new(),
    });
    let session = app.sessions.start(&token).unwrap();
    (app, format!("{}={session}", crate::auth::COOKIE))
}

async fn page(app: &Arc<App>, cookie: &str) -> String {
    let request = Request::builder()
        .uri("/fleet")
        .header("cookie", cookie)
        .body(Body::empty())
        .unwrap();
    let response = crate::api::router(Arc::clone(app))
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

fn spec(task: &str) -> serde_json::Value {
    serde_json::json!({"version": 1, "workspace": {"path": "/w"}, "task": task,
                       "provider": "script:/x", "loop": "react", "max_turns": 3})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_page_shows_the_queue_and_the_workers_of_a_postgres_log() {
    let url = match nerve_session::pg_cluster::test_database().await {
        Ok(url) => url,
        Err(error) if std::env::var("NERVE_REQUIRE_DOCKER").as_deref() == Ok("1") => {
            panic!("PostgreSQL is required here (NERVE_REQUIRE_DOCKER=1): {error}")
        }
        Err(error) => {
            eprintln!("skipping: {error}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let store = PgStore::connect(&url, Arc::new(Redactor::new()))
        .await
        .unwrap();
    let (app, cookie) = app(&url, &dir.path().join("tokens.db")).await;

    let empty = page(&app, &cookie).await;
    assert!(empty.contains("No worker has said it is alive"), "{empty}");
    assert!(empty.contains("The queue is empty"), "{empty}");

    let first = ExecutionId::new();
    let second = ExecutionId::new();
    store
        .submit(first, &spec("Edit the <result>."))
        .await
        .unwrap();
    store.submit(second, &spec("Then wait.")).await.unwrap();
    let worker = "host-a:4242";
    let claim = store
        .claim(worker, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claim.execution_id, first, "the oldest first");
    store.worker_seen(worker, "host-a", 2).await.unwrap();

    let shown = page(&app, &cookie).await;
    let link = |id: ExecutionId| format!("<a href=\"/executions/{id}\">{id}</a>");
    let workers = shown.split("id=\"workers\"").nth(1).unwrap();
    let workers = workers.split("</table>").next().unwrap();
    assert!(
        workers.contains("<td class=\"name\">host-a:4242</td>"),
        "{workers}"
    );
    assert!(
        workers.contains("<td class=\"host\">host-a</td>"),
        "{workers}"
    );
    assert!(workers.contains(&link(first)), "{workers}");
    assert!(!workers.contains(&second.to_string()), "{workers}");
    assert!(workers.contains("working"), "{workers}");
    let queue = shown.split("id=\"queue\"").nth(1).unwrap();
    assert!(
        queue.contains(&link(first)) && queue.contains(&link(second)),
        "{queue}"
    );
    assert!(
        queue.contains("<td class=\"state\">claimed</td>"),
        "{queue}"
    );
    assert!(queue.contains("<td class=\"state\">queued</td>"), "{queue}");
    assert!(
        queue.contains("<td class=\"worker\">host-a:4242</td>"),
        "{queue}"
    );
    assert!(
        queue.contains("Edit the &lt;result&gt;."),
        "escaped: {queue}"
    );
    // The newest first.
    assert!(queue.find(&second.to_string()) < queue.find(&first.to_string()));

    store.release(first, worker, true).await.unwrap();
    store.worker_stopped(worker).await.unwrap();
    let after = page(&app, &cookie).await;
    let workers = after.split("id=\"workers\"").nth(1).unwrap();
    let workers = workers.split("</table>").next().unwrap();
    assert!(workers.contains("stopped 20"), "{workers}");
    assert!(
        workers.contains("<td class=\"running\">none</td>"),
        "{workers}"
    );
    assert!(
        after.contains("<td class=\"state\">finished</td>"),
        "{after}"
    );
}
