//! The item-to-turn reading and the event encoder of `/v1/responses`, without a model.

use super::*;

fn request(body: Value) -> ResponsesRequest {
    serde_json::from_str(&body.to_string()).unwrap()
}

#[test]
fn items_become_the_turns_a_chat_would_send() {
    let req = request(json!({"instructions": "Be brief.", "input": [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call", "call_id": "call_2", "name": "noop", "arguments": "{}"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "done"}]},
        {"type": "function_call", "call_id": "call_3", "name": "noop", "arguments": "{}"},
        {"role": "user", "content": "Thanks"}]}));
    let conv = conversation(&req, Vec::new()).unwrap();
    let roles: Vec<Role> = conv.messages.iter().map(|m| m.role).collect();
    use Role::*;
    assert_eq!(
        roles,
        [System, System, User, Assistant, Tool, Tool, Assistant, User]
    );
    let m = &conv.messages;
    assert_eq!(m[0].content, "Be brief.");
    assert_eq!(m[2].content, "Weather?");
    // The answer's text and its two calls are one turn.
    assert_eq!(m[3].content, "Checking.");
    let calls: Vec<&str> = m[3].tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(calls, ["call_1", "call_2"]);
    assert_eq!(m[3].tool_calls[0].arguments, r#"{"city":"Paris"}"#);
    // Results carry their call's id and function name.
    assert_eq!(
        (m[4].tool_call_id.as_deref(), m[4].name.as_deref()),
        (Some("call_1"), Some("get_weather"))
    );
    assert_eq!(
        (m[5].content.as_str(), m[5].name.as_deref()),
        ("done", Some("noop"))
    );
    // A call after a tool result opens a new assistant turn.
    assert_eq!((m[6].content.as_str(), m[6].tool_calls.len()), ("", 1));
}

#[test]
fn what_a_stateless_text_server_cannot_read_is_refused_by_name() {
    let refused =
        |input: Value| conversation(&request(json!({"input": input})), Vec::new()).unwrap_err();
    let e = refused(json!([{"type": "item_reference", "id": "msg_1"}]));
    assert_eq!(e.status, StatusCode::BAD_REQUEST);
    let e = refused(json!([{"role": "user", "content": [{"type": "input_image"}]}]));
    assert_eq!(e.param.as_deref(), Some("input[0].content[0]"));
    let e = refused(json!([{"type": "function_call", "name": "f", "arguments": "{}"}]));
    assert_eq!(e.param.as_deref(), Some("input[0].call_id"));
    let e = refused(json!([{"role": "tool", "content": "x"}]));
    assert_eq!(e.param.as_deref(), Some("input[0].role"));
    let e = refused(json!([{"type": "computer_call_output"}]));
    assert_eq!(e.param.as_deref(), Some("input[0].type"));
    assert_eq!(refused(json!([])).param.as_deref(), Some("input"));
}

fn summary(why: Why) -> Summary {
    Summary {
        why,
        prompt_tokens: 10,
        cached: 4,
        completion_tokens: 3,
        stop_sequence: None,
        save_error: None,
        colibri: None,
    }
}

/// (event name, data) of an encoder's frames.
fn parse(frames: &str) -> Vec<(String, Value)> {
    frames
        .split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (head, data) = f.split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (head.strip_prefix("event: ").unwrap().to_string(), data)
        })
        .collect()
}

#[test]
fn a_stream_numbers_its_events_and_ends_with_the_whole_response() {
    let mut enc = Events {
        skeleton: json!({"id": "resp_1", "status": "in_progress", "output": []}),
        seq: 0,
        message_id: "msg_1".into(),
        text: String::new(),
        open: false,
    };
    let mut frames = enc.text("Hel");
    frames += &enc.text("lo");
    let call = ToolCall {
        id: "call_9".into(),
        name: "f".into(),
        arguments: "{\"a\":1}".into(),
    };
    frames += &enc.end("!", std::slice::from_ref(&call), Some(&summary(Why::Stop)));
    let ev = parse(&frames);
    let names: Vec<&str> = ev
        .iter()
        .map(|(n, _)| n.trim_start_matches("response."))
        .collect();
    assert_eq!(
        names,
        [
            "output_item.added",
            "content_part.added",
            "output_text.delta",
            "output_text.delta",
            "output_text.delta",
            "output_text.done",
            "content_part.done",
            "output_item.done",
            "output_item.added",
            "function_call_arguments.delta",
            "function_call_arguments.done",
            "output_item.done",
            "completed"
        ]
    );
    for (i, (name, data)) in ev.iter().enumerate() {
        assert_eq!(
            (data["type"].as_str(), data["sequence_number"].as_u64()),
            (Some(name.as_str()), Some(i as u64))
        );
    }
    assert_eq!(ev[5].1["text"], "Hello!");
    assert_eq!(ev[8].1["output_index"], 1);
    assert_eq!(ev[8].1["item"]["id"], "fc_9");
    let r = &ev[12].1["response"];
    assert_eq!(r["status"], "completed");
    assert_eq!(r["output"][0]["content"][0]["text"], "Hello!");
    assert_eq!(r["output"][1]["arguments"], "{\"a\":1}");
    assert_eq!(r["usage"]["input_tokens"], 10);
    assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 4);
    assert_eq!(r["usage"]["total_tokens"], 13);
}

#[test]
fn a_cut_answer_is_incomplete_and_a_lost_engine_failed() {
    let enc = || Events {
        skeleton: json!({"id": "resp_1", "status": "in_progress", "output": []}),
        seq: 2,
        message_id: "msg_1".into(),
        text: String::new(),
        open: false,
    };
    let ev = parse(&enc().end("", &[], Some(&summary(Why::Length))));
    let (name, last) = ev.last().unwrap();
    assert_eq!(name, "response.incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    // Nothing written still comes as an (empty) message, numbered on from the head's.
    assert_eq!(ev[0].1["sequence_number"], 2);
    assert_eq!(last["response"]["output"][0]["content"][0]["text"], "");
    let ev = parse(&enc().end("", &[], None));
    let (name, last) = ev.last().unwrap();
    assert_eq!(name, "response.failed");
    assert_eq!(last["response"]["error"]["code"], "server_error");
}
