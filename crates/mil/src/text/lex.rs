//! Tokens of MIL text, each with its 1-based line and column.

use crate::error::{MilError, Result};

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Ident(String),
    /// A number as written (`-1`, `0.125000`, `0x1p-3`, `-inf`), converted by the parser per dtype.
    Num(String),
    Str(String),
    /// One of `( ) [ ] { } < > , = ;`.
    Punct(char),
    Arrow,
    Eof,
}

#[derive(Debug, Clone)]
pub struct Token {
    pub tok: Tok,
    pub line: usize,
    pub col: usize,
}

pub fn tokenize(src: &str) -> Result<Vec<Token>> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
    let err = |line, col, msg: String| MilError::Parse { line, col, msg };
    while i < chars.len() {
        let c = chars[i];
        let (tl, tc) = (line, col);
        let advance = |i: &mut usize, line: &mut usize, col: &mut usize, n: usize| {
            for k in 0..n {
                if chars[*i + k] == '\n' {
                    *line += 1;
                    *col = 1;
                } else {
                    *col += 1;
                }
            }
            *i += n;
        };
        if c.is_whitespace() {
            advance(&mut i, &mut line, &mut col, 1);
            continue;
        }
        // `//` comments appear in hand-written programs; skip to end of line.
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            let n = chars[i..].iter().take_while(|&&ch| ch != '\n').count();
            advance(&mut i, &mut line, &mut col, n);
            continue;
        }
        let tok = if c == '-' && chars.get(i + 1) == Some(&'>') {
            advance(&mut i, &mut line, &mut col, 2);
            Tok::Arrow
        } else if c.is_ascii_alphabetic() || c == '_' {
            let n = chars[i..]
                .iter()
                .take_while(|ch| ch.is_ascii_alphanumeric() || **ch == '_' || **ch == '@')
                .count();
            let s: String = chars[i..i + n].iter().collect();
            advance(&mut i, &mut line, &mut col, n);
            Tok::Ident(s)
        } else if c.is_ascii_digit()
            || c == '.'
            || ((c == '-' || c == '+')
                && chars
                    .get(i + 1)
                    .is_some_and(|d| d.is_ascii_alphanumeric() || *d == '.'))
        {
            let mut n = 1;
            let hex = chars[i..]
                .iter()
                .skip_while(|c| **c == '-' || **c == '+')
                .take(2)
                .collect::<String>()
                .eq_ignore_ascii_case("0x");
            while let Some(&d) = chars.get(i + n) {
                let prev = chars[i + n - 1];
                let exp_sign = (d == '-' || d == '+')
                    && (if hex {
                        matches!(prev, 'p' | 'P')
                    } else {
                        matches!(prev, 'e' | 'E')
                    });
                if d.is_ascii_alphanumeric() || d == '.' || exp_sign {
                    n += 1;
                } else {
                    break;
                }
            }
            let s: String = chars[i..i + n].iter().collect();
            advance(&mut i, &mut line, &mut col, n);
            Tok::Num(s)
        } else if c == '"' {
            let mut s = String::new();
            let mut n = 1;
            loop {
                match chars.get(i + n) {
                    None | Some('\n') => return Err(err(tl, tc, "unterminated string".into())),
                    Some('"') => break,
                    Some('\\') => {
                        let esc = chars
                            .get(i + n + 1)
                            .ok_or_else(|| err(tl, tc, "unterminated string".into()))?;
                        s.push(match esc {
                            'n' => '\n',
                            't' => '\t',
                            other => *other,
                        });
                        n += 2;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        n += 1;
                    }
                }
            }
            advance(&mut i, &mut line, &mut col, n + 1);
            Tok::Str(s)
        } else if "()[]{}<>,=;".contains(c) {
            advance(&mut i, &mut line, &mut col, 1);
            Tok::Punct(c)
        } else {
            return Err(err(tl, tc, format!("unexpected character {c:?}")));
        };
        out.push(Token {
            tok,
            line: tl,
            col: tc,
        });
    }
    out.push(Token {
        tok: Tok::Eof,
        line,
        col,
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        tokenize(s).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn numbers_arrows_and_strings() {
        assert_eq!(
            toks("[1,-1] -> x=fp16(0x1p-3) y=-inf 1e-05"),
            vec![
                Tok::Punct('['),
                Tok::Num("1".into()),
                Tok::Punct(','),
                Tok::Num("-1".into()),
                Tok::Punct(']'),
                Tok::Arrow,
                Tok::Ident("x".into()),
                Tok::Punct('='),
                Tok::Ident("fp16".into()),
                Tok::Punct('('),
                Tok::Num("0x1p-3".into()),
                Tok::Punct(')'),
                Tok::Ident("y".into()),
                Tok::Punct('='),
                Tok::Num("-inf".into()),
                Tok::Num("1e-05".into()),
                Tok::Eof,
            ]
        );
        assert_eq!(toks(r#""a\"b""#), vec![Tok::Str("a\"b".into()), Tok::Eof]);
    }

    #[test]
    fn positions_and_errors() {
        let t = tokenize("a\n  b").unwrap();
        assert_eq!((t[1].line, t[1].col), (2, 3));
        match tokenize("x\n \"open").unwrap_err() {
            MilError::Parse { line, col, .. } => assert_eq!((line, col), (2, 2)),
            e => panic!("{e}"),
        }
        assert!(tokenize("a $ b").is_err());
    }
}
