//! The model caller: one model call with the budget checked before every attempt, retries
//! of transient failures with backoff (each one an event), the wall-clock deadline and
//! cancellation, and the spend of every attempt charged.
//!
//! Invariants:
//! - The budgets are checked before every attempt, retries, plan and summary calls
//!   included; the usage of every answered attempt is charged to `usage` and `cost`.
//! - Every attempt is recorded (`model_called`), answered or not. What led to the call
//!   goes to disk during the wait ([`Journal::issue`]); a retry's sleep waits for the log.
//! - A `context_overflow` is handed back ([`CallError::Overflow`]): the caller of this part
//!   decides whether compaction can make room. This part never changes the conversation.
//!
//! - Every attempt streams ([`Provider::stream`]): each delta goes to the
//!   [`DeltaObserver`] as it arrives, and only the assembled message goes on (the log
//!   keeps whole messages, never an event per token). A provider without a streaming wire,
//!   or configured with `stream = false`, replays its whole answer as deltas. A stream cut
//!   mid-way ends in a transient error and is retried like any other; the deltas already
//!   shown stay shown, and the retry's answer streams again from its start.
//! - A live stream's time to first token and tokens per second go on `model_called`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nerve_core::event::{CallOutcome, CallPurpose, ModelCalled, ModelErrorKind, Retry};
use nerve_core::{
    Event, ExecutionId, Message, MicroUsd, TerminationReason, TokenUsage, ToolDefinition,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::EngineConfig;
use crate::guards::runaway::RunawayGuard;
use crate::provider::model_call::{ModelRequest, ModelResponse, ProviderError};
use crate::provider::port::Provider;
use crate::provider::retry::RetryPolicy;
use crate::provider::stream::{DeltaObserver, ModelStream, StreamChunk};
use crate::run::journal::Journal;
use crate::stop::Stop;
use crate::telemetry::{self, TraceConfig};

/// A model call that failed: a stop, or a context overflow the caller may compact for.
#[derive(Debug)]
pub(crate) enum CallError {
    Stop(Stop),
    Overflow {
        message: String,
        /// The server's count of the refused prompt, when the refusal stated it.
        stated_tokens: Option<u64>,
    },
    /// The answer ran away and was stopped (what repeated, in a line): see `ModelErrorKind::Runaway`.
    Runaway(String),
}

impl From<Stop> for CallError {
    fn from(stop: Stop) -> Self {
        Self::Stop(stop)
    }
}

pub(crate) struct ModelCaller {
    /// On every model call's span.
    execution_id: ExecutionId,
    provider: Arc<dyn Provider>,
    /// Answers `plan` calls when set.
    planner: Option<Arc<dyn Provider>>,
    retry: RetryPolicy,
    config: Budgets,
    deadline: Option<Instant>,
    cancel: CancellationToken,
    /// Spent so far by every call of the execution (and, resumed, before it).
    usage: TokenUsage,
    cost: MicroUsd,
    /// What an attempt's span carries.
    trace: TraceConfig,
    /// Who sees the answers as they stream.
    deltas: Arc<dyn DeltaObserver>,
}

/// How a live stream went: what `model_called` records beside the outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct StreamTiming {
    pub(crate) time_to_first_token_ms: Option<u64>,
    pub(crate) tokens_per_second: Option<f64>,
}

impl StreamTiming {
    /// From when the request was sent (`sent`), the first delta arrived (`first`) and the
    /// stream ended (`end`), for an answer of `output_tokens`. Nothing without a delta;
    /// no rate when the stream took no measurable time after its first delta.
    pub(crate) fn measure(
        sent: Instant,
        first: Option<Instant>,
        end: Instant,
        output_tokens: u64,
    ) -> Self {
        let Some(first) = first else {
            return Self::default();
        };
        let ttft =
            u64::try_from(first.saturating_duration_since(sent).as_millis()).unwrap_or(u64::MAX);
        let generation = end.saturating_duration_since(first).as_secs_f64();
        #[allow(clippy::cast_precision_loss)] // token counts stay far below 2^52
        let rate = (generation >= 0.001 && output_tokens > 0)
            .then(|| (output_tokens as f64 / generation * 10.0).round() / 10.0);
        Self {
            time_to_first_token_ms: Some(ttft),
            tokens_per_second: rate,
        }
    }
}

/// The limits and prices the caller charges by.
#[derive(Debug, Clone, Copy)]
struct Budgets {
    tokens: Option<u64>,
    cost: Option<MicroUsd>,
    pricing: crate::provider::model_table::Pricing,
}

impl ModelCaller {
    pub(crate) fn new(
        execution_id: ExecutionId,
        provider: Arc<dyn Provider>,
        planner: Option<Arc<dyn Provider>>,
        config: &EngineConfig,
        cancel: CancellationToken,
        spent: (TokenUsage, MicroUsd),
        deltas: Arc<dyn DeltaObserver>,
    ) -> Self {
        Self {
            execution_id,
            provider,
            planner,
            retry: config.retry,
            config: Budgets {
                tokens: config.budget_tokens,
                cost: config.budget_cost,
                pricing: config.pricing,
            },
            deadline: config.timeout.map(|t| Instant::now() + t),
            cancel,
            usage: spent.0,
            cost: spent.1,
            trace: config.trace.clone(),
            deltas,
        }
    }

    /// The provider of the execution's agent calls.
    pub(crate) fn provider(&self) -> &dyn Provider {
        &*self.provider
    }

    pub(crate) fn usage(&self) -> TokenUsage {
        self.usage
    }

    pub(crate) fn cost(&self) -> MicroUsd {
        self.cost
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Adds what a child execution spent (a `delegate` call's): one budget.
    pub(crate) fn charge(&mut self, usage: TokenUsage, cost: MicroUsd) {
        self.usage += usage;
        self.cost += cost;
    }

    /// The budgets as they stand: the limits, and what is spent.
    pub(crate) fn budgets(&self) -> (Option<u64>, Option<MicroUsd>) {
        (self.config.tokens, self.config.cost)
    }

    /// The cost of `usage` at this execution's prices.
    pub(crate) fn price(&self, usage: TokenUsage) -> MicroUsd {
        self.config.pricing.cost(usage)
    }

    /// The share of the tightest budget already used, in percent (0 without budgets).
    pub(crate) fn budget_used_percent(&self) -> u32 {
        let tokens = self
            .config
            .tokens
            .map_or(0, |limit| percent(self.usage.total(), limit));
        let cost = self
            .config
            .cost
            .map_or(0, |limit| percent(self.cost.0, limit.0));
        tokens.max(cost)
    }

    /// Whether what is left of a budget is at most the reserve (the near-budget warning).
    pub(crate) fn near_budget(&self, reserve_tokens: u64, reserve_cost_percent: u32) -> bool {
        let tokens_near = self
            .config
            .tokens
            .is_some_and(|limit| limit.saturating_sub(self.usage.total()) <= reserve_tokens);
        let cost_near = self.config.cost.is_some_and(|limit| {
            let reserve = limit.0 / 100 * u64::from(reserve_cost_percent);
            limit.0.saturating_sub(self.cost.0) <= reserve
        });
        tokens_near || cost_near
    }

    /// Budgets are checked before every model call, retries and plan calls included.
    fn check_budget(&self) -> Result<(), Stop> {
        if let Some(limit) = self.config.tokens
            && self.usage.total() >= limit
        {
            return Err(Stop::new(
                TerminationReason::BudgetExhausted,
                format!(
                    "token budget exhausted: {} of {limit} tokens used",
                    self.usage.total()
                ),
            ));
        }
        if let Some(limit) = self.config.cost
            && self.cost >= limit
        {
            return Err(Stop::new(
                TerminationReason::BudgetExhausted,
                format!("cost budget exhausted: {} of {limit} spent", self.cost),
            ));
        }
        Ok(())
    }

    /// One model call with retries on `messages`. The usage of every attempt is charged.
    pub(crate) async fn call(
        &mut self,
        journal: &mut Journal,
        turn: u32,
        purpose: CallPurpose,
        messages: &[Message],
        tools: &[ToolDefinition],
    ) -> Result<ModelResponse, CallError> {
        let provider = match (purpose, &self.planner) {
            (CallPurpose::Plan, Some(planner)) => Arc::clone(planner),
            (CallPurpose::Plan | CallPurpose::Agent | CallPurpose::Summary, _) => {
                Arc::clone(&self.provider)
            }
        };
        let mut attempt = 1;
        let mut slept = Duration::ZERO;
        // Ends: each pass is one attempt; a transient error is retried only while
        // RetryPolicy::next_delay allows (max_attempts, connection_attempts, and
        // max_total_delay of sleep in all), any other outcome returns, and the budget,
        // cancellation and the run's deadline (which also cuts an attempt short) are
        // checked first.
        loop {
            self.check_budget()?;
            if self.cancel.is_cancelled() {
                return Err(Stop::shutdown().into());
            }
            // What led to this call (a compaction, a reminder) goes to disk during the wait,
            // behind the turn boundary's commit if that is still running; whatever the
            // answer leads to waits for both.
            journal.issue(None);
            let request = ModelRequest {
                messages,
                tools,
                purpose,
            };
            let (result, timing) = match self.attempt(&*provider, request, turn, attempt).await {
                Ok(answered) => answered,
                Err(stop) => {
                    if stop.reason == TerminationReason::Shutdown {
                        // The call was made and abandoned: recorded, so that a resumed
                        // scripted run takes the next line, as this process did (it does
                        // not begin a turn: replay.rs).
                        journal.record(Event::ModelCalled(ModelCalled {
                            turn,
                            purpose,
                            outcome: CallOutcome::Cancelled,
                            usage: TokenUsage::default(),
                            time_to_first_token_ms: None,
                            tokens_per_second: None,
                        }));
                    }
                    return Err(stop.into());
                }
            };
            let (outcome, usage) = match &result {
                Ok(response) => (CallOutcome::Ok, response.usage),
                Err(error) => (CallOutcome::Failed(error.kind()), TokenUsage::default()),
            };
            journal.record(Event::ModelCalled(ModelCalled {
                turn,
                purpose,
                outcome,
                usage,
                time_to_first_token_ms: timing.time_to_first_token_ms,
                tokens_per_second: timing.tokens_per_second,
            }));
            match result {
                Ok(response) => {
                    self.usage += response.usage;
                    self.cost += self.config.pricing.cost(response.usage);
                    return Ok(response);
                }
                Err(ProviderError::Transient {
                    kind: ModelErrorKind::Runaway,
                    message,
                    ..
                }) => return Err(CallError::Runaway(message)),
                Err(ProviderError::Transient {
                    kind,
                    message,
                    retry_after,
                }) => {
                    let next = self.retry.next_delay(attempt, slept, kind, retry_after);
                    let Some(delay) = next else {
                        return Err(Stop::new(
                            TerminationReason::Error,
                            format!("provider failed after {attempt} attempts: {kind}: {message}"),
                        )
                        .into());
                    };
                    let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                    journal.record(Event::Retry(Retry {
                        turn,
                        attempt,
                        error: kind.to_owned(),
                        delay_ms,
                    }));
                    journal.flush().await.map_err(Stop::from)?;
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = self.cancel.cancelled() => return Err(Stop::shutdown().into()),
                    }
                    slept += delay;
                    attempt += 1;
                }
                Err(ProviderError::ContextOverflow {
                    message,
                    stated_tokens,
                }) => {
                    return Err(CallError::Overflow {
                        message,
                        stated_tokens,
                    });
                }
                Err(error @ ProviderError::Permanent { .. }) => {
                    return Err(Stop::new(
                        TerminationReason::Error,
                        format!("provider error: {error}"),
                    )
                    .into());
                }
            }
        }
    }

    /// One attempt: the provider asked once, within the wall-clock deadline, its answer
    /// streamed to the observer. `Err` only when the deadline passed or the run was
    /// cancelled; the provider's own
    /// failure is the inner result. Each attempt is one `chat` span, a deadline cut-off
    /// included (an error span).
    async fn attempt(
        &self,
        provider: &dyn Provider,
        request: ModelRequest<'_>,
        turn: u32,
        attempt: u32,
    ) -> Result<(Result<ModelResponse, ProviderError>, StreamTiming), Stop> {
        let span = telemetry::chat_span(
            telemetry::ChatInfo {
                execution_id: self.execution_id,
                provider: provider.name(),
                model: provider.model(),
                purpose: request.purpose,
                turn,
                attempt,
            },
            &self.trace,
            request.messages,
        );
        let call = self.stream(provider, request).instrument(span.clone());
        let deadline = async {
            match self.deadline {
                Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                None => std::future::pending().await,
            }
        };
        // A stop cuts the answer short too (stop means stop): nothing of it is recorded, so
        // a resumed run asks again (a scripted run replays the same line).
        let (result, timing) = tokio::select! {
            result = call => result,
            () = deadline => {
                let why = "wall-clock timeout reached during a model call";
                telemetry::record_chat_error(
                    &span,
                    &self.trace,
                    ModelErrorKind::Timeout.as_str(),
                    why,
                );
                return Err(Stop::new(TerminationReason::TimedOut, why));
            }
            () = self.cancel.cancelled() => {
                let why = "the execution was stopped during a model call";
                telemetry::record_chat_error(&span, &self.trace, CallOutcome::Cancelled.as_str(), why);
                return Err(Stop::shutdown());
            }
        };
        let usage = result.as_ref().map(|r| r.usage).unwrap_or_default();
        telemetry::record_chat_result(
            &span,
            &self.trace,
            provider.model(),
            &result,
            self.config.pricing.cost(usage),
        );
        Ok((result, timing))
    }

    /// Asks `provider` for a stream and drains it: every delta to the observer as it
    /// arrives, the terminal chunk's result back. A live stream is timed.
    ///
    /// A live stream is drained by a task of its own on the runtime, which this one
    /// awaits. The connection's bytes arrive on a runtime worker (hyper's connection
    /// task), one frame at a time; the task driving the run may be elsewhere (`nerve run`
    /// drives it in `block_on` on the main thread), and draining it there cost every frame
    /// two wake-ups across threads, one each way. Drained beside the connection, a frame
    /// reaches the observer without leaving the worker, and the run's task wakes once when
    /// the answer is complete. The observer sees the deltas in order, from that task.
    async fn stream(
        &self,
        provider: &dyn Provider,
        request: ModelRequest<'_>,
    ) -> (Result<ModelResponse, ProviderError>, StreamTiming) {
        let purpose = request.purpose;
        let sent = Instant::now();
        let stream = provider.stream(request).await;
        let live = stream.is_live();
        let drain = drain(stream, Arc::clone(&self.deltas), self.execution_id, purpose);
        let (end, first) = if live {
            match AbortOnDrop(tokio::spawn(drain.in_current_span())).await {
                Ok(drained) => drained,
                Err(error) => match error.try_into_panic() {
                    // The observer's (or the decoder's) panic, as if it had been ours.
                    Ok(panic) => std::panic::resume_unwind(panic),
                    Err(_) => (None, None),
                },
            }
        } else {
            drain.await
        };
        let result = end.unwrap_or_else(|| {
            Err(ProviderError::transient(
                ModelErrorKind::TruncatedStream,
                "the stream ended without a terminal chunk",
            ))
        });
        let timing = match &result {
            Ok(response) if live => {
                StreamTiming::measure(sent, first, Instant::now(), response.usage.output_tokens)
            }
            Ok(_) | Err(_) => StreamTiming::default(),
        };
        (result, timing)
    }
}

/// Drains `stream`: every delta to `deltas` as it arrives. Returns the terminal chunk's
/// result and when the first delta came.
async fn drain(
    mut stream: ModelStream,
    deltas: Arc<dyn DeltaObserver>,
    execution_id: ExecutionId,
    purpose: CallPurpose,
) -> (
    Option<Result<ModelResponse, ProviderError>>,
    Option<Instant>,
) {
    let mut first = None;
    let mut end = None;
    // Ends: a ModelStream yields exactly one terminal chunk and then None
    // (provider/stream.rs); an HTTP body that goes silent past its idle limit ends with a
    // timeout error (provider/http.rs), and the run's deadline cuts the attempt.
    // Only a live stream is watched: what it saves is the model's time. (A whole answer
    // replayed as deltas has been paid for; the output limit bounds it.)
    let mut guard = stream.is_live().then(RunawayGuard::default);
    while let Some(chunk) = stream.next().await {
        match chunk {
            StreamChunk::Delta(delta) => {
                first.get_or_insert_with(Instant::now);
                deltas.delta(execution_id, purpose, &delta);
                if let Some(why) = guard.as_mut().and_then(|g| g.observe(&delta)) {
                    // Dropping the stream closes the connection: the server stops too.
                    tracing::warn!(%why, "stopped a runaway answer");
                    let error = ProviderError::transient(ModelErrorKind::Runaway, why);
                    return (Some(Err(error)), first);
                }
            }
            StreamChunk::End(result) => end = Some(result),
        }
    }
    (end, first)
}

/// A spawned task that is aborted when its handle is dropped: a call given up (the
/// deadline, a cancelled run) stops reading its stream, which closes the connection.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::future::Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

fn percent(used: u64, limit: u64) -> u32 {
    if limit == 0 {
        return 100;
    }
    u32::try_from(u128::from(used) * 100 / u128::from(limit)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use async_trait::async_trait;
    use bytes::Bytes;
    use nerve_core::{EventSink, TaskId, TaskStatus};

    use super::*;
    use crate::config::EngineConfig;
    use crate::engine::{AgentEngine, Task};
    use crate::provider::openai::ChatStreamDecoder;
    use crate::provider::stream::{Delta, MemorySource, ModelStream};
    use crate::provider::tokens::{Estimate, UsageEstimate};
    use nerve_core::testing::{EchoTools, MemorySink};

    /// Streams one canned Chat Completions body per call, in order.
    struct Streams(Mutex<VecDeque<&'static str>>);

    #[async_trait]
    impl Provider for Streams {
        fn name(&self) -> &str {
            "streams"
        }
        fn model(&self) -> &str {
            "streams"
        }
        async fn complete(&self, _: ModelRequest<'_>) -> Result<ModelResponse, ProviderError> {
            panic!("the engine streams every call");
        }
        async fn stream(&self, _: ModelRequest<'_>) -> ModelStream {
            let body = self.0.lock().unwrap().pop_front().expect("a body per call");
            let chunks = body
                .split_inclusive("\n\n")
                .map(|event| Bytes::copy_from_slice(event.as_bytes()))
                .collect();
            let estimate = UsageEstimate {
                input: 10,
                counter: Arc::new(Estimate),
                calibration: None,
            };
            ModelStream::new(MemorySource(chunks), ChatStreamDecoder::new(estimate))
        }
    }

    #[derive(Default)]
    struct Seen(Mutex<Vec<(CallPurpose, Delta)>>);

    impl DeltaObserver for Seen {
        fn delta(&self, _: ExecutionId, purpose: CallPurpose, delta: &Delta) {
            self.0.lock().unwrap().push((purpose, delta.clone()));
        }
    }

    const CUT: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n";
    const WHOLE: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"lo ✓\"},\"finish_reason\":\"stop\"}]}\n\n\
        data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3}}\n\n\
        data: [DONE]\n\n";

    #[test]
    fn timings_need_a_delta_and_a_measurable_stream() {
        let sent = Instant::now();
        let first = sent + Duration::from_millis(250);
        let end = first + Duration::from_secs(2);
        let timing = StreamTiming::measure(sent, Some(first), end, 75);
        assert_eq!(timing.time_to_first_token_ms, Some(250));
        assert_eq!(timing.tokens_per_second, Some(37.5));
        assert_eq!(
            StreamTiming::measure(sent, None, end, 75),
            StreamTiming::default()
        );
        let instant = StreamTiming::measure(sent, Some(first), first, 75);
        assert_eq!(instant.time_to_first_token_ms, Some(250));
        assert_eq!(instant.tokens_per_second, None);
    }

    #[tokio::test]
    async fn a_stream_cut_mid_answer_is_retried_and_every_delta_is_seen() {
        let sink = Arc::new(MemorySink::default());
        let seen = Arc::new(Seen::default());
        let mut config = EngineConfig::default();
        config.retry.base_delay = Duration::from_millis(1);
        let mut engine = AgentEngine::new(
            Arc::new(Streams(Mutex::new([CUT, WHOLE].into()))),
            Arc::new(EchoTools::default()),
            Arc::clone(&sink) as Arc<dyn EventSink>,
            config,
        );
        engine.deltas = Arc::clone(&seen) as Arc<dyn DeltaObserver>;
        let task = Task {
            id: TaskId::new(),
            description: "say hello".into(),
            metadata: serde_json::Value::Null,
            status: TaskStatus::Created,
            workspace: "/w".into(),
        };
        let result = engine
            .run(ExecutionId::new(), task, CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(result.termination_reason, TerminationReason::Completed);
        assert_eq!(
            result.context.messages.last().unwrap().text_content(),
            "Hello ✓"
        );
        // The cut attempt's delta was shown; the retry streamed its answer from the start.
        let seen: Vec<_> = seen.0.lock().unwrap().clone();
        assert_eq!(
            seen,
            ["Hel", "Hel", "lo ✓"]
                .map(|t| (CallPurpose::Agent, Delta::Text(t.into())))
                .to_vec()
        );
        let calls: Vec<ModelCalled> = sink
            .events()
            .into_iter()
            .filter_map(|e| {
                if let Event::ModelCalled(called) = e {
                    Some(called)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0].outcome,
            CallOutcome::Failed(ModelErrorKind::TruncatedStream)
        );
        assert_eq!(
            calls[0].time_to_first_token_ms, None,
            "failed calls are not timed"
        );
        assert_eq!(calls[1].outcome, CallOutcome::Ok);
        assert_eq!(calls[1].usage, TokenUsage::new(10, 3));
        assert!(calls[1].time_to_first_token_ms.is_some(), "{:?}", calls[1]);
        assert!(sink.kinds().contains(&"retry"));
        // The log keeps whole messages: one assistant message, no event per delta.
        let answers = sink
            .events()
            .iter()
            .filter(|e| matches!(e, Event::MessageAppended(m) if m.message.role == nerve_core::MessageRole::Assistant))
            .count();
        assert_eq!(answers, 1);
    }
}
