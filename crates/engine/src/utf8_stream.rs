//! Streaming detokenisation: token pieces are byte strings that may split a UTF-8 character;
//! this buffer releases only complete characters.

#[derive(Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `bytes` and returns the text that is now complete. Bytes that can never become
    /// valid UTF-8 come out as U+FFFD, so a bad piece cannot stall the stream.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix is valid UTF-8 by construction.
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is left at the end of the stream (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_characters_come_out_whole() {
        let text = "a😀é中";
        let bytes = text.as_bytes();
        for cut1 in 0..=bytes.len() {
            for cut2 in cut1..=bytes.len() {
                let mut s = Utf8Stream::new();
                let mut out = s.push(&bytes[..cut1]);
                out += &s.push(&bytes[cut1..cut2]);
                out += &s.push(&bytes[cut2..]);
                out += &s.finish();
                assert_eq!(out, text);
            }
        }
        let mut s = Utf8Stream::new();
        assert_eq!(s.push(&[0xF0, 0x9F]), "");
        assert_eq!(s.push(&[0x98, 0x80, b'!']), "😀!");
    }

    #[test]
    fn invalid_bytes_do_not_stall() {
        let mut s = Utf8Stream::new();
        assert_eq!(s.push(&[b'a', 0xFF, b'b']), "a\u{FFFD}b");
        assert_eq!(s.push(&[0xE4]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }
}
