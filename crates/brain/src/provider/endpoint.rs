//! What the OpenAI and Anthropic clients share around a request: the endpoint they post to
//! and how a whole or streamed answer comes back ([`Endpoint`]), the output limit that fits
//! the window ([`output_limit`]), tool-call arguments kept as the server wrote them
//! ([`RawArguments`]), and tool-call ids a strict API accepts ([`safe_call_id`]).

use nerve_core::event::ModelErrorKind;
use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use reqwest::header::HeaderMap;

use crate::provider::http::{self, ClientError, HttpClient, HttpConfig};
use crate::provider::model_call::{ModelRequest, ModelResponse, ProviderError};
pub(crate) use crate::provider::stream::RawArguments;
use crate::provider::stream::{ModelStream, StreamDecoder, WholeAnswer};
use crate::provider::tokens::{Calibration, TokenCounter, UsageEstimate, counter_for_model};

/// Decodes a whole response body.
pub(crate) type Decode =
    fn(&[u8], &UsageEstimate, Option<&RawArguments>) -> Result<ModelResponse, ProviderError>;

/// One API endpoint: where requests go, with which headers, and how answers come back.
#[derive(Debug)]
pub(crate) struct Endpoint {
    url: String,
    headers: HeaderMap,
    client: HttpClient,
    counter: Arc<dyn TokenCounter>,
    /// The arguments of the tool calls this endpoint returned, as it wrote them.
    pub(crate) raw: Arc<RawArguments>,
    /// Set once the server gave whole an answer it would not stream.
    whole_only: Arc<AtomicBool>,
    /// How the server's prompt counts compare with the estimate's.
    calibration: Arc<Calibration>,
}

impl Endpoint {
    /// `base` is the checked base URL, `path` what the API appends to it.
    pub(crate) fn new(
        provider: &'static str,
        http: &HttpConfig,
        base: &str,
        path: &str,
        headers: HeaderMap,
        model: &str,
    ) -> Result<Self, ClientError> {
        Ok(Self {
            url: format!("{base}{path}"),
            headers,
            client: HttpClient::new(provider, http, base)?,
            counter: counter_for_model(model),
            raw: Arc::new(RawArguments::default()),
            whole_only: Arc::new(AtomicBool::new(false)),
            calibration: Arc::default(),
        })
    }

    /// What the prompt costs, for the output limit and for usage the server does not report.
    pub(crate) fn estimate(&self, request: &ModelRequest<'_>) -> UsageEstimate {
        UsageEstimate::for_request(&self.counter, request).calibrated(&self.calibration)
    }

    /// Posts `body` and decodes the whole answer.
    pub(crate) async fn complete(
        &self,
        body: &impl serde::Serialize,
        estimate: &UsageEstimate,
        decode: Decode,
    ) -> Result<ModelResponse, ProviderError> {
        let response = self
            .client
            .post(&self.url, self.headers.clone(), http::encode(body)?, false)
            .await
            .inspect_err(|error| self.learn(estimate, error))?;
        let body = http::read_body(self.client.body(response)).await?;
        decode(&body, estimate, Some(&self.raw))
    }

    /// How the server's prompt counts compare with the estimate, in thousandths.
    pub(crate) fn prompt_scale_permille(&self) -> u64 {
        self.calibration.permille()
    }

    /// Whether answers are still asked for as streams: not once a server accepted a
    /// streamed request, sent nothing, and then gave the same answer whole.
    pub(crate) fn streams(&self) -> bool {
        !self.whole_only.load(Ordering::Relaxed)
    }

    /// Posts `body` asking for a stream and decodes it with `decoder`; a server that
    /// ignores `stream: true` and answers whole is decoded with `decode`. A stream that
    /// gives nothing (see [`ModelStream::or_whole`]) is asked for again whole (the same
    /// body with `stream: false`); when that answer is not empty, this endpoint asks for
    /// whole answers from then on ([`Endpoint::streams`]).
    pub(crate) async fn stream(
        &self,
        body: &impl serde::Serialize,
        estimate: UsageEstimate,
        decode: Decode,
        decoder: impl StreamDecoder + 'static,
    ) -> ModelStream {
        let body = match http::encode(body) {
            Ok(body) => body,
            Err(error) => return ModelStream::from_result(Err(error)),
        };
        match self
            .client
            .post(&self.url, self.headers.clone(), body.clone(), true)
            .await
        {
            Ok(response) if http::is_json(&response) => {
                let body = http::read_body(self.client.body(response)).await;
                ModelStream::from_result(
                    body.and_then(|body| decode(&body, &estimate, Some(&self.raw))),
                )
            }
            Ok(response) => ModelStream::new(self.client.body(response), decoder)
                .or_whole(self.whole_answer(body, estimate, decode)),
            Err(error) => {
                self.learn(&estimate, &error);
                ModelStream::from_result(Err(error))
            }
        }
    }

    /// A refusal for a prompt over the window that states the server's count of it
    /// calibrates the estimate: the next output limit, after the engine has compacted,
    /// then leaves room by the server's count.
    fn learn(&self, estimate: &UsageEstimate, error: &ProviderError) {
        if let ProviderError::ContextOverflow {
            stated_tokens: Some(stated),
            ..
        } = *error
        {
            self.calibration.observe(estimate.input, stated);
        }
    }

    /// What asks for the answer to the streamed request `streamed` whole.
    fn whole_answer(
        &self,
        streamed: Bytes,
        estimate: UsageEstimate,
        decode: Decode,
    ) -> WholeAnswer {
        let client = self.client.clone();
        let url = self.url.clone();
        let headers = self.headers.clone();
        let raw = Arc::clone(&self.raw);
        let whole_only = Arc::clone(&self.whole_only);
        Box::new(move || {
            Box::pin(async move {
                tracing::warn!(
                    provider = client.provider(),
                    "the server streamed nothing for this request; asking for the answer whole"
                );
                let body = not_streamed(&streamed)?;
                let response = client.post(&url, headers, body, false).await?;
                let body = http::read_body(client.body(response)).await?;
                let answer = decode(&body, &estimate, Some(&raw))?;
                // An empty answer whole too is the model's: the stream was not at fault.
                if !answer.message.parts.is_empty() && !whole_only.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        provider = client.provider(),
                        "the server answered whole what it would not stream: asking for whole answers from now on (`stream = false` in the provider's configuration skips the attempt)"
                    );
                }
                Ok(answer)
            })
        })
    }
}

/// The JSON body `streamed` with streaming off: `"stream":false`, no `stream_options`,
/// every other byte as it was (key order included: a server's prompt cache, and the
/// prompt prefix the next request repeats, depend on them). Both fields are the last ones
/// the request types serialize, so the last match is theirs, whatever a tool schema or a
/// message holds.
fn not_streamed(streamed: &[u8]) -> Result<Bytes, ProviderError> {
    const STREAM: &[u8] = b"\"stream\":true";
    const OPTIONS: &[u8] = b",\"stream_options\":{\"include_usage\":true}";
    let last = |needle: &[u8]| streamed.windows(needle.len()).rposition(|w| w == needle);
    let Some(at) = last(STREAM) else {
        return Err(ProviderError::permanent(
            ModelErrorKind::BadRequest,
            "cannot ask for the answer whole: the request has no \"stream\":true",
        ));
    };
    let mut body = Vec::with_capacity(streamed.len());
    body.extend_from_slice(&streamed[..at]);
    body.extend_from_slice(b"\"stream\":false");
    let rest = &streamed[at + STREAM.len()..];
    match rest.strip_prefix(OPTIONS) {
        Some(after) => body.extend_from_slice(after),
        None => body.extend_from_slice(rest),
    }
    Ok(Bytes::from(body))
}

/// Output tokens below this are not worth asking for: a prompt that leaves less room is
/// sent with this limit, so that the server reports the overflow and the engine compacts.
const MIN_OUTPUT: u64 = 256;

/// The output limit to send: at most the configured `limit` (the model's), and at most
/// the room the `window` leaves after the prompt (`prompt` tokens as estimated, plus a
/// tenth for the estimate's error and the chat template). `None`: neither is known.
pub(crate) fn output_limit(limit: Option<u64>, window: Option<u64>, prompt: u64) -> Option<u64> {
    let room = window.map(|window| {
        window
            .saturating_sub(prompt.saturating_add(prompt / 10))
            .max(MIN_OUTPUT)
    });
    match (limit, room) {
        (Some(limit), Some(room)) => Some(limit.min(room)),
        (limit, room) => limit.or(room),
    }
}

/// A tool-call id as an API with strict ids accepts it (Anthropic: `[A-Za-z0-9_-]+`;
/// OpenAI: at most 40 characters). An id that already fits is kept; any other becomes
/// `call_` and a hash of it, the same for the call and its result, so they still match.
pub(crate) fn safe_call_id(id: &str) -> Cow<'_, str> {
    let fits = !id.is_empty()
        && id.len() <= 40
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if fits {
        return Cow::Borrowed(id);
    }
    // FNV-1a: stable across processes and versions, unlike the standard hasher.
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    Cow::Owned(format!("call_{hash:016x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_limit_fits_the_window() {
        let check = |limit, window, prompt, expected| {
            assert_eq!(
                output_limit(limit, window, prompt),
                expected,
                "{limit:?} {window:?} {prompt}"
            );
        };
        check(None, None, 1000, None);
        check(Some(8192), None, 1000, Some(8192));
        // A 4k window with a 1,000-token prompt leaves 2,996 after the margin.
        check(Some(8192), Some(4096), 1000, Some(2996));
        check(None, Some(4096), 1000, Some(2996));
        check(Some(1000), Some(4096), 1000, Some(1000));
        // A prompt that fills the window still asks for a little, for the server to refuse.
        check(Some(8192), Some(4096), 5000, Some(MIN_OUTPUT));
        check(Some(100), Some(4096), 5000, Some(100));
    }

    proptest::proptest! {
        #[test]
        fn the_output_limit_never_exceeds_the_model_or_the_room(
            limit in proptest::option::of(1_u64..1_000_000),
            window in proptest::option::of(0_u64..2_000_000),
            prompt in 0_u64..3_000_000,
        ) {
            let sent = output_limit(limit, window, prompt);
            proptest::prop_assert_eq!(sent.is_some(), limit.is_some() || window.is_some());
            if let (Some(sent), Some(limit)) = (sent, limit) {
                proptest::prop_assert!(sent <= limit);
            }
            if let (Some(sent), Some(window)) = (sent, window) {
                proptest::prop_assert!(sent <= window.saturating_sub(prompt).max(MIN_OUTPUT));
            }
        }

        #[test]
        fn any_id_becomes_one_a_strict_api_takes(id in ".{0,60}") {
            let safe = safe_call_id(&id);
            proptest::prop_assert!(!safe.is_empty() && safe.len() <= 40);
            proptest::prop_assert!(safe.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
            proptest::prop_assert_eq!(safe.clone(), safe_call_id(&id));
        }
    }

    #[test]
    fn a_streamed_body_becomes_a_whole_one_byte_for_byte() {
        let streamed = br#"{"model":"m","tools":[{"parameters":{"properties":{"stream":true}}}],"z":1,"stream":true,"stream_options":{"include_usage":true}}"#;
        assert_eq!(
            &not_streamed(streamed).unwrap()[..],
            br#"{"model":"m","tools":[{"parameters":{"properties":{"stream":true}}}],"z":1,"stream":false}"#
        );
        let messages = br#"{"b":2,"a":1,"stream":true}"#;
        assert_eq!(
            &not_streamed(messages).unwrap()[..],
            br#"{"b":2,"a":1,"stream":false}"#
        );
        assert!(not_streamed(br#"{"stream":false}"#).is_err());
    }

    #[test]
    fn call_ids_become_safe_and_stay_paired() {
        assert_eq!(safe_call_id("toolu_01A09q90qw90"), "toolu_01A09q90qw90");
        let odd = safe_call_id("functions.shell:0");
        assert!(odd.starts_with("call_") && odd.len() == 21, "{odd}");
        assert_eq!(odd, safe_call_id("functions.shell:0"));
        assert_ne!(odd, safe_call_id("functions.shell:1"));
        assert_ne!(safe_call_id(""), "");
        assert!(safe_call_id(&"a".repeat(41)).len() <= 40);
    }
}
