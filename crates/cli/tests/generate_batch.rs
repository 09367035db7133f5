//! `tokenmill generate --input/--output`: offline batch generation through the engine.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use common::model_path;

#[test]
fn a_200_prompt_batch_completes_in_input_order() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("prompts.jsonl");
    let output = dir.path().join("out.jsonl");
    let mut file = std::fs::File::create(&input).unwrap();
    for i in 0..200 {
        let line = if i % 3 == 0 {
            serde_json::json!({"messages": [{"role": "user", "content": format!("Count to {i}.")}], "max_tokens": 3 + i % 4})
        } else {
            serde_json::json!({"prompt": format!("Item number {i} is"), "max_tokens": 2 + i % 5, "temperature": 0.0, "ignore_eos": true})
        };
        writeln!(file, "{line}").unwrap();
    }
    drop(file);

    let status = Command::new(common::binary())
        .args(["generate", "--model"])
        .arg(model_path())
        .args([
            "--kv-cache-memory",
            "256MiB",
            "--max-num-seqs",
            "32",
            "--input",
        ])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .status()
        .unwrap();
    assert!(status.success());

    let text = std::fs::read_to_string(&output).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 200);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], i, "line {i} out of order");
        let tokens = line["token_ids"].as_array().unwrap().len();
        let max_tokens = if i % 3 == 0 { 3 + i % 4 } else { 2 + i % 5 };
        assert!(
            tokens >= 1 && tokens <= max_tokens,
            "line {i}: {tokens} tokens"
        );
        if i % 3 != 0 {
            // ignore_eos: exactly max_tokens, finish reason length.
            assert_eq!(tokens, max_tokens);
            assert_eq!(line["finish_reason"], "length");
        }
        assert_eq!(line["usage"]["completion_tokens"], tokens);
        assert!(line["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        assert!(line["error"].is_null());
    }
}

/// Runs `generate --input` over `lines` (a JSONL text) with a small KV budget; returns the
/// process output and the results file's path.
#[allow(clippy::unwrap_used)]
fn generate_lines(dir: &tempfile::TempDir, lines: &str) -> (std::process::Output, PathBuf) {
    generate_lines_with(dir, lines, &[])
}

/// [`generate_lines`] with extra engine flags.
#[allow(clippy::unwrap_used)]
fn generate_lines_with(
    dir: &tempfile::TempDir,
    lines: &str,
    flags: &[&str],
) -> (std::process::Output, PathBuf) {
    let input = dir.path().join("prompts.jsonl");
    let output = dir.path().join("out.jsonl");
    std::fs::write(&input, lines).unwrap();
    let result = Command::new(common::binary())
        .args(["generate", "--model"])
        .arg(model_path())
        .args(flags)
        .args(["--kv-cache-memory", "64MiB", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    (result, output)
}

#[test]
fn a_bad_input_line_is_reported_with_its_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let (result, _) = generate_lines(&dir, "{\"prompt\": \"ok\"}\n{not json}\n");
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("prompts.jsonl:2"), "{stderr}");
}

#[test]
fn an_unknown_field_is_refused_by_name_not_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (result, _) = generate_lines(
        &dir,
        "{\"prompt\": \"ok\", \"repetition_penalty\": 1.2, \"min_tokens\": 2}\n{\"prompt\": \"x\", \"bad_words\": [\"y\"]}\n",
    );
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("prompts.jsonl:2"), "{stderr}");
    assert!(stderr.contains("bad_words"), "{stderr}");
}

#[test]
fn penalties_and_min_tokens_from_a_line_reach_the_sampler() {
    let dir = tempfile::tempdir().unwrap();
    // Greedy with a strong repetition penalty cannot repeat a token of prompt or output, and
    // an invalid penalty is that line's error, not a silently dropped field.
    let (result, output) = generate_lines(
        &dir,
        "{\"prompt\": \"a a a a a a a a\", \"max_tokens\": 12, \"repetition_penalty\": 100.0, \"ignore_eos\": true}\n{\"prompt\": \"x\", \"presence_penalty\": 7.0}\n",
    );
    assert!(result.status.success());
    let text = std::fs::read_to_string(&output).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<u64> = lines[0]["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap())
        .collect();
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "a token repeated: {ids:?}");
    let error = lines[1]["error"].as_str().unwrap_or_default();
    assert!(error.contains("presence_penalty"), "{}", lines[1]);
}

#[test]
fn tools_and_tool_choice_from_a_line_write_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"], "additionalProperties": false}}}]);
    let ask = serde_json::json!([{"role": "user", "content": "Weather in Paris?"}]);
    let lines = [
        serde_json::json!({"messages": ask, "tools": tools, "tool_choice": "required", "max_tokens": 60}),
        serde_json::json!({"messages": ask, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 60}),
        // A round trip: the earlier call and its result in the history.
        serde_json::json!({"messages": [ask[0], {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
            "tools": tools, "tool_choice": "none", "max_tokens": 5}),
    ];
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    let (result, output) = generate_lines(&dir, &text);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let written: Vec<serde_json::Value> = std::fs::read_to_string(output)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    for line in &written[..2] {
        assert_eq!(line["finish_reason"], "tool_calls", "{line}");
        assert!(line["content"].is_null(), "{line}");
        let call = &line["tool_calls"][0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["function"]["name"], "get_weather");
        let arguments: serde_json::Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(arguments["city"].is_string(), "{line}");
    }
    assert_eq!(written[2]["tool_calls"], serde_json::json!([]));
    assert!(written[2]["content"].is_string());
    // auto needs the server-style flags, named in the error.
    let (refused, _) = generate_lines(
        &dir,
        &format!("{}\n", serde_json::json!({"messages": ask, "tools": tools})),
    );
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--enable-auto-tool-choice"));
}

#[allow(clippy::unwrap_used)]
fn written_lines(output: PathBuf) -> Vec<serde_json::Value> {
    std::fs::read_to_string(output)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn structured_outputs_from_a_line_constrain_its_text() {
    let dir = tempfile::tempdir().unwrap();
    let schema = serde_json::json!({"type": "object", "properties": {"color": {"enum": ["red", "green"]},
        "sizes": {"type": "array", "items": {"enum": ["S", "M"]}, "minItems": 1, "maxItems": 2}},
        "required": ["color", "sizes"], "additionalProperties": false});
    let lines = [
        serde_json::json!({"prompt": "Is the sky blue? Answer:", "guided_choice": ["yes", "no"], "max_tokens": 5}),
        serde_json::json!({"messages": [{"role": "user", "content": "A shirt as JSON."}], "max_tokens": 60,
            "response_format": {"type": "json_schema", "json_schema": {"name": "shirt", "schema": schema}}}),
        serde_json::json!({"prompt": "A number:", "structured_outputs": {"regex": "[0-9]{3}"}, "max_tokens": 8}),
        serde_json::json!({"prompt": "JSON:", "response_format": {"type": "json_object"}, "max_tokens": 40}),
    ];
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    for compact in [false, true] {
        let flags: &[&str] = if compact {
            &[
                "--structured-outputs-config",
                r#"{"disable_any_whitespace": true}"#,
            ]
        } else {
            &[]
        };
        let (result, output) = generate_lines_with(&dir, &text, flags);
        assert!(
            result.status.success(),
            "{}",
            String::from_utf8_lossy(&result.stderr)
        );
        let written = written_lines(output);
        let texts: Vec<&str> = written
            .iter()
            .map(|l| l["text"].as_str().unwrap())
            .collect();
        assert!(["yes", "no"].contains(&texts[0]), "{:?}", texts[0]);
        assert_eq!(written[0]["finish_reason"], "stop");
        let shirt: serde_json::Value = serde_json::from_str(texts[1]).unwrap();
        assert!(
            ["red", "green"].contains(&shirt["color"].as_str().unwrap()),
            "{shirt}"
        );
        let sizes = shirt["sizes"].as_array().unwrap();
        assert!((1..=2).contains(&sizes.len()), "{shirt}");
        assert!(
            texts[2].len() == 3 && texts[2].bytes().all(|b| b.is_ascii_digit()),
            "{:?}",
            texts[2]
        );
        if compact {
            // No whitespace anywhere: the values are enums without spaces.
            assert!(!texts[1].contains(char::is_whitespace), "{:?}", texts[1]);
        }
        if written[3]["finish_reason"] == "stop" {
            assert!(serde_json::from_str::<serde_json::Value>(texts[3])
                .unwrap()
                .is_object());
        }
    }
}

#[test]
fn a_bad_structured_output_in_a_line_names_the_field_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let (result, _) = generate_lines(
        &dir,
        "{\"prompt\": \"ok\"}\n{\"prompt\": \"x\", \"guided_regex\": \"(\"}\n",
    );
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("prompts.jsonl:2"), "{stderr}");
    assert!(stderr.contains("guided_regex"), "{stderr}");
    let (result, _) = generate_lines(
        &dir,
        "{\"prompt\": \"x\", \"guided_choice\": [\"a\"], \"guided_regex\": \"a\"}\n",
    );
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("Only one kind"), "{stderr}");
}

#[test]
fn a_lines_model_picks_its_lora_adapter() {
    use tokenmill_models::{
        read_model_config, write_random_peft_adapter, LoraTarget, ModelSource, RandomLoraSpec,
    };
    let dir = tempfile::tempdir().unwrap();
    let config = read_model_config(&ModelSource::from_path(model_path())).unwrap();
    let adapter = dir.path().join("loud");
    let spec = RandomLoraSpec {
        rank: 8,
        alpha: 16.0,
        targets: vec![LoraTarget::Q, LoraTarget::V, LoraTarget::Down],
        seed: 7,
        a_scale: 0.25,
        b_scale: 0.25,
    };
    write_random_peft_adapter(&adapter, &config, &spec).unwrap();
    let module = format!("loud={}", adapter.display());
    let flags = ["--enable-lora", "--lora-modules", module.as_str()];
    let prompt =
        "\"prompt\": \"The capital of France is\", \"max_tokens\": 8, \"ignore_eos\": true";
    let lines = format!("{{{prompt}}}\n{{{prompt}, \"model\": \"loud\"}}\n{{{prompt}}}\n");
    let (result, output) = generate_lines_with(&dir, &lines, &flags);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let lines = written_lines(output);
    // Greedy: the two base lines agree, the adapter's line differs.
    assert_eq!(lines[0]["token_ids"], lines[2]["token_ids"]);
    assert_ne!(
        lines[0]["token_ids"], lines[1]["token_ids"],
        "the adapter had no effect"
    );

    let (result, _) =
        generate_lines_with(&dir, "{\"prompt\": \"x\", \"model\": \"quiet\"}\n", &flags);
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.contains("prompts.jsonl:1") && stderr.contains("quiet"),
        "{stderr}"
    );
    let (result, _) = generate_lines(&dir, "{\"prompt\": \"x\", \"model\": \"loud\"}\n");
    assert!(!result.status.success());
    assert!(String::from_utf8_lossy(&result.stderr).contains("--enable-lora"));
}
