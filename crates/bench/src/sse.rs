//! Incremental server-sent-events parsing: bytes arrive split or merged arbitrarily by the
//! network; events come out whole.

/// One complete SSE event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// A `data:` payload (multi-line data joined with `\n`), with its `event:` name if any.
    Data { event: Option<String>, data: String },
    /// The OpenAI end-of-stream sentinel `data: [DONE]`.
    Done,
}

/// Accumulates bytes and yields events at blank-line boundaries (`\n\n`, `\r\n\r\n`).
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
    event_name: Option<String>,
    data_lines: Vec<String>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds received bytes; returns the events they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        // Lines are only consumed once their terminator has arrived, so a UTF-8 sequence or a
        // JSON document split across reads is never decoded half-way.
        while let Some(newline) = self.buffer.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buffer.drain(..=newline).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            if let Some(event) = self.process_line(&line) {
                events.push(event);
            }
        }
        events
    }

    /// Flushes an event left unterminated when the stream closed.
    pub fn finish(&mut self) -> Option<SseEvent> {
        if !self.buffer.is_empty() {
            let rest = std::mem::take(&mut self.buffer);
            let line = String::from_utf8_lossy(&rest).into_owned();
            let line = line.trim_end_matches('\r').to_string();
            if let Some(event) = self.process_line(&line) {
                return Some(event);
            }
        }
        self.dispatch()
    }

    fn process_line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None; // comment / keep-alive ping
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => self.data_lines.push(value.to_string()),
            "event" => self.event_name = Some(value.to_string()),
            _ => {} // id, retry and unknown fields do not matter to a benchmark
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event_name.take();
        if self.data_lines.is_empty() {
            return None;
        }
        let data = std::mem::take(&mut self.data_lines).join("\n");
        if data.trim() == "[DONE]" {
            return Some(SseEvent::Done);
        }
        Some(SseEvent::Data { event, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(text: &str) -> SseEvent {
        SseEvent::Data {
            event: None,
            data: text.to_string(),
        }
    }

    #[test]
    fn merged_events_in_one_read() {
        let mut parser = SseParser::new();
        let events = parser.push(b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n");
        assert_eq!(
            events,
            vec![data("{\"a\":1}"), data("{\"a\":2}"), SseEvent::Done]
        );
        assert_eq!(parser.finish(), None);
    }

    #[test]
    fn event_split_at_every_byte() {
        let stream = "data: {\"text\":\"h\u{e9}llo\"}\r\n\r\n: ping\n\ndata:[DONE]\n\n";
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        for byte in stream.as_bytes() {
            events.extend(parser.push(std::slice::from_ref(byte)));
        }
        assert_eq!(
            events,
            vec![data("{\"text\":\"h\u{e9}llo\"}"), SseEvent::Done]
        );
    }

    #[test]
    fn error_event_keeps_its_name_and_multiline_data_joins() {
        let mut parser = SseParser::new();
        let events = parser.push(b"event: error\ndata: {\"error\":\ndata: \"boom\"}\n\n");
        assert_eq!(
            events,
            vec![SseEvent::Data {
                event: Some("error".into()),
                data: "{\"error\":\n\"boom\"}".into()
            }]
        );
    }

    #[test]
    fn unterminated_last_event_is_flushed_on_finish() {
        let mut parser = SseParser::new();
        assert!(parser.push(b"data: {\"x\":1}\n\ndata: {\"y\"").len() == 1);
        assert!(parser.push(b":2}").is_empty());
        assert_eq!(parser.finish(), Some(data("{\"y\":2}")));
    }
}
