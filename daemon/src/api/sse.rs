//! A job's channel of text as a response: streamed as server-sent events in an API's own
//! event shapes (an [`Encoder`]), or collected whole. Tool-call text goes through the
//! [`Hold`] either way, so it never reaches a client as content.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc::UnboundedReceiver;

use super::tools::Hold;
use super::worker::{Out, Summary, TokenLp};
use crate::engine::conversation::ToolCall;

/// One API's SSE frames.
pub trait Encoder: Send + 'static {
    /// A piece of content.
    fn text(&mut self, text: &str) -> String;
    /// A piece of reasoning (gpt-oss's analysis channel): the frame that carries it, or
    /// nothing where the API has no field for it.
    fn reasoning(&mut self, _text: &str) -> String {
        String::new()
    }
    /// The end: the content still held, the calls, and how the request ended (`None`: the
    /// engine went away mid-answer).
    fn end(&mut self, rest: &str, calls: &[ToolCall], summary: Option<&Summary>) -> String;
    /// A token's logprobs, which come before its text (an encoder that reports them keeps
    /// them for its next frame).
    fn logprob(&mut self, _lp: TokenLp) {}
    /// The prompt's read-out ([`Out::Echo`]), before any text: the frame that carries it, if
    /// this encoder reports one.
    fn echo(&mut self, _lps: Vec<TokenLp>) -> Option<String> {
        None
    }
}

/// `data: <json>\n\n`, optionally with an `event:` line (Anthropic names its events).
pub fn frame(event: Option<&str>, data: &serde_json::Value) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

struct Streaming<E> {
    rx: UnboundedReceiver<Out>,
    hold: Option<Hold>,
    enc: E,
}

/// The SSE response: `head` first, then the encoder's frames as text arrives. When the client
/// goes away the body (and with it the receiver) is dropped, which the engine thread sees.
pub fn stream(rx: UnboundedReceiver<Out>, hold: Hold, enc: impl Encoder, head: String) -> Response {
    use futures_util::StreamExt;
    let frames = choice_items((rx, hold, enc)).map(|item| match item {
        Item::Frame(f) | Item::Last(f, _) => f,
    });
    sse_response(futures_util::stream::once(async move { head }).chain(frames))
}

/// An event stream of these frames as the response body.
fn sse_response(frames: impl futures_util::Stream<Item = String> + Send + 'static) -> Response {
    use futures_util::StreamExt;
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(frames.map(|f| Ok::<_, Infallible>(Bytes::from(f)))),
    )
        .into_response()
}

/// One choice's frames in a stream of several: its last frame comes with how it ended.
enum Item {
    Frame(String),
    Last(String, Option<Summary>),
}

/// What the response of [`stream_n`] writes once every choice ended, given how each did.
pub type Tail = Box<dyn FnOnce(&[Option<Summary>]) -> String + Send>;

/// A choice of [`stream_n`]: its job's receiver, the hold of its tool-call text, and an
/// encoder that writes its choice index and does not close the stream itself.
pub type Choice<E> = (UnboundedReceiver<Out>, Hold, E);

fn choice_items<E: Encoder>((rx, hold, enc): Choice<E>) -> impl futures_util::Stream<Item = Item> {
    let st = Streaming {
        rx,
        hold: Some(hold),
        enc,
    };
    futures_util::stream::unfold(st, |mut st| async move {
        loop {
            let msg = st.rx.recv().await;
            let hold = st.hold.as_mut()?;
            match msg {
                Some(Out::Text(t)) => {
                    let content = hold.push(&t);
                    let reasoning = hold.take_reasoning();
                    let mut f = String::new();
                    if !reasoning.is_empty() {
                        f += &st.enc.reasoning(&reasoning);
                    }
                    if !content.is_empty() {
                        f += &st.enc.text(&content);
                    }
                    if !f.is_empty() {
                        return Some((Item::Frame(f), st));
                    }
                }
                Some(Out::Logprob(lp)) => st.enc.logprob(lp),
                Some(Out::Echo(lps)) => {
                    if let Some(f) = st.enc.echo(lps) {
                        return Some((Item::Frame(f), st));
                    }
                }
                Some(Out::Done(s)) => {
                    let done = st.hold.take()?.finish_all();
                    let mut f = s.save_error.as_deref().map_or(String::new(), |e| {
                        format!(": warning: {}\n\n", save_warning(e))
                    });
                    if !done.reasoning.is_empty() {
                        f += &st.enc.reasoning(&done.reasoning);
                    }
                    f += &st.enc.end(&done.rest, &done.calls, Some(&s));
                    return Some((Item::Last(f, Some(s)), st));
                }
                Some(_) => {}
                None => {
                    let (rest, calls) = st.hold.take()?.finish();
                    let f = st.enc.end(&rest, &calls, None);
                    return Some((Item::Last(f, None), st));
                }
            }
        }
    })
}

/// Several choices of one request as one SSE response (`n` > 1): `head`, then each choice's
/// frames in the order they come, then `tail` once the last choice ended.
pub fn stream_n<E: Encoder>(choices: Vec<Choice<E>>, head: String, tail: Tail) -> Response {
    use futures_util::StreamExt;
    let n = choices.len();
    let merged =
        futures_util::stream::select_all(choices.into_iter().map(|c| Box::pin(choice_items(c))));
    let st = (merged, Vec::with_capacity(n), Some(tail));
    let frames = futures_util::stream::unfold(st, move |mut st| async move {
        let f = match st.0.next().await? {
            Item::Frame(f) => f,
            Item::Last(mut f, s) => {
                st.1.push(s);
                if st.1.len() == n {
                    if let Some(tail) = st.2.take() {
                        f += &tail(&st.1);
                    }
                }
                f
            }
        };
        Some((f, st))
    });
    sse_response(futures_util::stream::once(async move { head }).chain(frames))
}

/// A whole answer: its content, its calls, and how it ended (`None`: the engine went away).
pub async fn collect(
    rx: UnboundedReceiver<Out>,
    hold: Hold,
) -> (String, Vec<ToolCall>, Option<Summary>) {
    let (content, calls, summary, _) = collect_logprobs(rx, hold).await;
    (content, calls, summary)
}

/// [`collect`], and the tokens' logprobs when the request asked for them (the prompt's
/// read-out first, when it asked for that too).
pub async fn collect_logprobs(
    rx: UnboundedReceiver<Out>,
    hold: Hold,
) -> (String, Vec<ToolCall>, Option<Summary>, Vec<TokenLp>) {
    let c = collect_all(rx, hold).await;
    (c.content, c.calls, c.summary, c.logprobs)
}

/// A whole answer as [`collect_all`] gathers it.
pub struct Collected {
    pub content: String,
    /// gpt-oss's analysis channel (empty for the other families).
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
    /// How it ended (`None`: the engine went away).
    pub summary: Option<Summary>,
    pub logprobs: Vec<TokenLp>,
}

/// [`collect_logprobs`], with the answer's reasoning.
pub async fn collect_all(mut rx: UnboundedReceiver<Out>, mut hold: Hold) -> Collected {
    let mut lps = Vec::new();
    let summary = loop {
        match rx.recv().await {
            Some(Out::Text(t)) => {
                hold.push(&t);
            }
            Some(Out::Logprob(lp)) => lps.push(lp),
            Some(Out::Echo(read_out)) => lps.extend(read_out),
            Some(Out::Done(s)) => break Some(s),
            Some(_) => {}
            None => break None,
        }
    };
    let mut content = hold.released().to_string();
    // Nothing was taken from the hold: the end hands over all the reasoning.
    let done = hold.finish_all();
    content.push_str(&done.rest);
    Collected {
        content,
        reasoning: done.reasoning,
        calls: done.calls,
        summary,
        logprobs: lps,
    }
}

/// What a client is told when its conversation could not be saved after a whole answer: the
/// answer stands, and the next request resends the history it would have reused.
pub fn save_warning(why: &str) -> String {
    format!("the answer is complete but the conversation could not be saved ({why}); it will not survive a restart")
}

/// The `x-colibri-warning` header of a non-streamed answer whose save failed (a header value
/// cannot hold a newline; other bytes are kept as they are).
pub fn warn_header(r: &mut Response, s: Option<&Summary>) {
    if let Some(e) = s.and_then(|s| s.save_error.as_deref()) {
        let text = save_warning(e).replace(['\r', '\n'], " ");
        if let Ok(v) = axum::http::HeaderValue::from_str(&text) {
            r.headers_mut().insert("x-colibri-warning", v);
        }
    }
}
