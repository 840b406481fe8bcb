//! The Unicode facts the llama.cpp tokenizers rely on: UTF-8 decoding with its error handling,
//! a per-codepoint category (\p{L}, \p{N}, ...) plus the White_Space property, and GPT-2's
//! byte <-> printable-character mapping.

use std::sync::OnceLock;

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

/// The Unicode general category, grouped the way llama.cpp's regex classes group it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Category {
    /// Unassigned (Cn), or beyond U+10FFFF.
    Undefined,
    Number,
    Letter,
    Separator,
    Mark,
    Punctuation,
    Symbol,
    /// Cc, Cf, Co, Cs.
    Control,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpFlags {
    pub category: Category,
    pub whitespace: bool,
}

impl CpFlags {
    pub fn is_letter(self) -> bool {
        self.category == Category::Letter
    }
    pub fn is_number(self) -> bool {
        self.category == Category::Number
    }
    pub fn is_mark(self) -> bool {
        self.category == Category::Mark
    }
}

/// The White_Space property (Unicode PropList.txt).
pub(crate) fn is_whitespace(cp: u32) -> bool {
    matches!(cp, 0x09..=0x0D | 0x20 | 0x85 | 0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000)
}

pub(crate) fn category(cp: u32) -> Category {
    if (0xD800..=0xDFFF).contains(&cp) {
        return Category::Control; // surrogates (Cs)
    }
    // llama.cpp's tables are Unicode 15.1; the category crate is pinned to 15.0, so the 627
    // codepoints 15.1 added are listed here (CJK Extension I, ideographic description chars).
    match cp {
        0x2EBF0..=0x2EE5D => return Category::Letter,
        0x2FFC..=0x2FFF | 0x31EF => return Category::Symbol,
        _ => {}
    }
    let Some(c) = char::from_u32(cp) else {
        return Category::Undefined;
    };
    match get_general_category(c) {
        Gc::Unassigned => Category::Undefined,
        Gc::Control | Gc::Format | Gc::PrivateUse | Gc::Surrogate => Category::Control,
        Gc::UppercaseLetter
        | Gc::LowercaseLetter
        | Gc::TitlecaseLetter
        | Gc::ModifierLetter
        | Gc::OtherLetter => Category::Letter,
        Gc::NonspacingMark | Gc::SpacingMark | Gc::EnclosingMark => Category::Mark,
        Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber => Category::Number,
        Gc::ConnectorPunctuation
        | Gc::DashPunctuation
        | Gc::OpenPunctuation
        | Gc::ClosePunctuation
        | Gc::InitialPunctuation
        | Gc::FinalPunctuation
        | Gc::OtherPunctuation => Category::Punctuation,
        Gc::MathSymbol | Gc::CurrencySymbol | Gc::ModifierSymbol | Gc::OtherSymbol => {
            Category::Symbol
        }
        Gc::SpaceSeparator | Gc::LineSeparator | Gc::ParagraphSeparator => Category::Separator,
    }
}

pub(crate) fn flags(cp: u32) -> CpFlags {
    CpFlags {
        category: category(cp),
        whitespace: is_whitespace(cp),
    }
}

/// Simple lowercase mapping of one codepoint (the one-to-one part of Unicode's mapping).
pub(crate) fn to_lower(cp: u32) -> u32 {
    let Some(c) = char::from_u32(cp) else {
        return cp;
    };
    let mut lower = c.to_lowercase();
    match (lower.next(), lower.next()) {
        (Some(l), None) => l as u32,
        _ => cp,
    }
}

/// The byte length of a UTF-8 sequence from its first byte, as llama.cpp estimates it (a stray
/// continuation byte counts as one).
pub(crate) fn utf8_len(first: u8) -> usize {
    match first >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

/// Decodes UTF-8 to codepoints the way llama.cpp does: each byte that does not start a complete
/// sequence becomes one U+FFFD. Overlong forms are not rejected.
pub(crate) fn codepoints(bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match decode_one(&bytes[i..]) {
            Some((cp, n)) => {
                out.push(cp);
                i += n;
            }
            None => {
                out.push(0xFFFD);
                i += 1;
            }
        }
    }
    out
}

fn decode_one(b: &[u8]) -> Option<(u32, usize)> {
    let lead = b[0];
    let n = match lead {
        0x00..=0x7F => return Some((lead.into(), 1)),
        0x80..=0xBF => return None,
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => return None,
    };
    if b.len() < n || !b[1..n].iter().all(|&c| c & 0xC0 == 0x80) {
        return None;
    }
    let mut cp = u32::from(lead) & (0x7F >> n);
    for &c in &b[1..n] {
        cp = (cp << 6) | u32::from(c & 0x3F);
    }
    Some((cp, n))
}

/// Appends the UTF-8 encoding of `cp`; values that are not scalar values (surrogates, beyond
/// U+10FFFF) are written as U+FFFD.
pub(crate) fn push_utf8(out: &mut Vec<u8>, cp: u32) {
    let c = char::from_u32(cp).unwrap_or(char::REPLACEMENT_CHARACTER);
    let mut buf = [0u8; 4];
    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
}

/// GPT-2's reversible map from bytes to printable characters: printable Latin-1 bytes map to
/// themselves, the other 68 to U+0100.. in byte order.
pub(crate) fn byte_to_char(b: u8) -> char {
    byte_maps().0[usize::from(b)]
}

/// The inverse of [`byte_to_char`].
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as usize;
    byte_maps().1.get(cp).copied().flatten()
}

#[allow(clippy::type_complexity)]
fn byte_maps() -> &'static ([char; 256], [Option<u8>; 0x144]) {
    static MAPS: OnceLock<([char; 256], [Option<u8>; 0x144])> = OnceLock::new();
    MAPS.get_or_init(|| {
        let printable = |b: u8| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut fwd = ['\0'; 256];
        let mut inv = [None; 0x144];
        let mut next = 256u32;
        for b in 0..=255u8 {
            let cp = if printable(b) {
                u32::from(b)
            } else {
                next += 1;
                next - 1
            };
            // cp < 0x144 and never a surrogate, so the conversion cannot fail.
            let c = char::from_u32(cp).unwrap_or(char::REPLACEMENT_CHARACTER);
            fwd[usize::from(b)] = c;
            inv[cp as usize] = Some(b);
        }
        (fwd, inv)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2s() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('€'), None);
    }

    #[test]
    fn invalid_utf8_becomes_one_replacement_per_byte() {
        assert_eq!(codepoints(b"a\xC3"), vec![0x61, 0xFFFD]);
        assert_eq!(codepoints(b"\xE2\x96\x81x"), vec![0x2581, 0x78]);
        assert_eq!(codepoints(b"\x80\xE2\x96"), vec![0xFFFD, 0xFFFD, 0xFFFD]);
    }

    #[test]
    fn categories() {
        assert_eq!(category('a' as u32), Category::Letter);
        assert_eq!(category('٣' as u32), Category::Number);
        assert_eq!(category('\u{301}' as u32), Category::Mark);
        assert_eq!(category('!' as u32), Category::Punctuation);
        assert_eq!(category('$' as u32), Category::Symbol);
        assert_eq!(category('\u{200D}' as u32), Category::Control);
        assert_eq!(category(0x0378), Category::Undefined);
        // Unicode 15.1 (CJK Extension I) is known; Unicode 16 additions are not, as in llama.cpp.
        assert_eq!(category(0x2EBF0), Category::Letter);
        assert_eq!(category(0x1C89), Category::Undefined);
        assert!(flags(0x3000).whitespace && !flags('x' as u32).whitespace);
    }
}
