//! Server-sent events: bytes in, `data` payloads out, across arbitrary read boundaries.

/// The longest server-sent event line (and event) accepted from a provider.
pub const MAX_SSE_LINE_BYTES: usize = 1 << 20;

/// Decodes an SSE byte stream into the `data` of each event.
#[derive(Debug, Default)]
pub struct SseDecoder {
    pending: Vec<u8>,
    data: Vec<String>,
}

impl SseDecoder {
    /// Feeds bytes; returns the data of every event they complete. Multi-line `data:` fields
    /// join with `\n`; comments and other fields are ignored.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, String> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        let too_long = || format!("the provider sent a stream line or event longer than {MAX_SSE_LINE_BYTES} bytes");
        while let Some(len) = self.pending[start..].iter().position(|&b| b == b'\n') {
            if len > MAX_SSE_LINE_BYTES {
                return Err(too_long());
            }
            let raw = &self.pending[start..start + len];
            start += len + 1;
            let line = std::str::from_utf8(raw).map_err(|e| format!("invalid UTF-8: {e}"))?;
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.is_empty() {
                if !self.data.is_empty() {
                    events.push(std::mem::take(&mut self.data).join("\n"));
                }
            } else if let Some(value) = line.strip_prefix("data:") {
                self.data.push(value.strip_prefix(' ').unwrap_or(value).to_owned());
                if self.data.iter().map(String::len).sum::<usize>() > MAX_SSE_LINE_BYTES {
                    return Err(too_long());
                }
            }
        }
        self.pending.drain(..start);
        if self.pending.len() > MAX_SSE_LINE_BYTES {
            return Err(too_long());
        }
        Ok(events)
    }

    /// Ends the stream: the last event, if it was not followed by a blank line.
    pub fn finish(&mut self) -> Result<Option<String>, String> {
        let mut events = if self.pending.is_empty() { Vec::new() } else { self.push(b"\n")? };
        if !self.data.is_empty() {
            events.push(std::mem::take(&mut self.data).join("\n"));
        }
        Ok(events.pop())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_survive_any_split() {
        let stream = b"data: {\"a\":1}\n\n: comment\nevent: x\ndata: line1\ndata: line2\r\n\r\ndata: [DONE]\n\n";
        for split in 0..stream.len() {
            let mut d = SseDecoder::default();
            let mut got = d.push(&stream[..split]).unwrap();
            got.extend(d.push(&stream[split..]).unwrap());
            assert_eq!(got, vec!["{\"a\":1}", "line1\nline2", "[DONE]"], "split at {split}");
        }
    }

    #[test]
    fn an_unterminated_last_event_is_kept() {
        let mut d = SseDecoder::default();
        assert!(d.push(b"data: tail").unwrap().is_empty());
        assert_eq!(d.finish().unwrap().as_deref(), Some("tail"));
    }

    #[test]
    fn a_whole_line_or_event_past_the_limit_in_one_read_is_an_error() {
        let mut line = b"data: ".to_vec();
        line.extend(vec![b'x'; MAX_SSE_LINE_BYTES + 1]);
        line.extend(b"\n\n");
        assert!(SseDecoder::default().push(&line).unwrap_err().contains("longer than"));
        // Many short data lines of one event, past the limit together.
        let half = format!("data: {}\n", "y".repeat(MAX_SSE_LINE_BYTES / 2 + 1));
        let event = format!("{half}{half}\n");
        assert!(SseDecoder::default().push(event.as_bytes()).unwrap_err().contains("longer than"));
    }

    #[test]
    fn a_line_past_the_limit_is_an_error_before_it_ends() {
        let mut d = SseDecoder::default();
        let chunk = vec![b'x'; MAX_SSE_LINE_BYTES / 2 + 1];
        assert!(d.push(&chunk).is_ok());
        assert!(d.push(&chunk).unwrap_err().contains("longer than"));
    }
}
