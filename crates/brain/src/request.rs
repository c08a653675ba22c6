//! What the OpenAI and Anthropic clients share around a request: the endpoint they post to
//! and how a whole or streamed answer comes back ([`Endpoint`]), the output limit that fits
//! the window ([`output_limit`]), tool-call arguments kept as the server wrote them
//! ([`RawArguments`]), and tool-call ids a strict API accepts ([`safe_call_id`]).

use std::borrow::Cow;
use std::sync::Arc;

use reqwest::header::HeaderMap;

use crate::answer::{ModelRequest, ModelResponse, ProviderError};
use crate::http::{self, ClientError, HttpClient, HttpConfig};
pub(crate) use crate::stream::RawArguments;
use crate::stream::{ModelStream, StreamDecoder};
use crate::tokens::{TokenCounter, UsageEstimate, counter_for_model};

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
        })
    }

    /// What the prompt costs, for the output limit and for usage the server does not report.
    pub(crate) fn estimate(&self, request: &ModelRequest<'_>) -> UsageEstimate {
        UsageEstimate::for_request(&self.counter, request)
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
            .post(&self.url, self.headers.clone(), body, false)
            .await?;
        let body = http::read_body(self.client.body(response)).await?;
        decode(&body, estimate, Some(&self.raw))
    }

    /// Posts `body` asking for a stream and decodes it with `decoder`; a server that
    /// ignores `stream: true` and answers whole is decoded with `decode`.
    pub(crate) async fn stream(
        &self,
        body: &impl serde::Serialize,
        estimate: UsageEstimate,
        decode: Decode,
        decoder: impl StreamDecoder + 'static,
    ) -> ModelStream {
        match self
            .client
            .post(&self.url, self.headers.clone(), body, true)
            .await
        {
            Ok(response) if http::is_json(&response) => {
                let body = http::read_body(self.client.body(response)).await;
                ModelStream::from_result(
                    body.and_then(|body| decode(&body, &estimate, Some(&self.raw))),
                )
            }
            Ok(response) => ModelStream::new(self.client.body(response), decoder),
            Err(error) => ModelStream::from_result(Err(error)),
        }
    }
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
