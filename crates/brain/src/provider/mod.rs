//! One model call: the provider port and the vocabulary it speaks, the wire formats (HTTP,
//! Server-Sent Events, streamed answers, JSON text), the OpenAI-compatible and Anthropic
//! clients and the scripted one, the model table, token counting, the retry policy, and
//! tools written as text. The floor of brain: nothing here imports anything outside it.

pub mod anthropic;
pub(crate) mod call_repair;
pub(crate) mod endpoint;
pub mod http;
pub(crate) mod json_text;
pub mod model_call;
pub mod model_table;
pub mod openai;
pub mod port;
pub mod retry;
pub mod scripted;
pub mod sse;
pub mod stream;
pub mod text_tools;
pub mod tokens;
