//! Number spelling in MIL text.
//!
//! Floats are printed in fixed notation with at least six decimals — the C `%f` form of every
//! hardware-proven program (`fp16(0.125000)`, FACTS §1.3) — and with more decimals only when
//! six would not read back as the same value, so print → parse → print is exact. Parsing also
//! accepts exponents and C hex floats (`fp16(0x1p-3)`, MAD `ane_int8_bench.m`).

/// Fixed-notation spelling of `v` that reads back to the same value through `same`.
fn fixed(v: f64, same: impl Fn(f64) -> bool) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    for decimals in 6..=60 {
        let s = format!("{v:.decimals$}");
        if s.parse::<f64>().is_ok_and(&same) {
            return s;
        }
    }
    format!("{v:.70}")
}

pub fn format_f16(v: half::f16) -> String {
    fixed(v.to_f64(), |p| {
        half::f16::from_f64(p).to_bits() == v.to_bits()
    })
}

pub fn format_f32(v: f32) -> String {
    fixed(v as f64, |p| (p as f32).to_bits() == v.to_bits())
}

pub fn format_f64(v: f64) -> String {
    fixed(v, |p| p.to_bits() == v.to_bits())
}

/// Parses a decimal float, `inf`/`nan`, or a C hex float (`-0x1.8p+2`).
pub fn parse_float(s: &str) -> Option<f64> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v = match body {
        "inf" | "infinity" | "INF" => f64::INFINITY,
        "nan" | "NAN" => f64::NAN,
        _ => match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
            Some(hex) => parse_hex_float(hex)?,
            None => {
                if !body.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
                    return None;
                }
                body.parse::<f64>().ok()?
            }
        },
    };
    Some(if neg { -v } else { v })
}

/// `1.8p+2` (after the `0x`): hex mantissa, optional binary exponent.
fn parse_hex_float(s: &str) -> Option<f64> {
    let (mant, exp) = match s.find(['p', 'P']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i32>().ok()?),
        None => (s, 0),
    };
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let mut v = 0f64;
    for c in int.chars() {
        v = v * 16.0 + c.to_digit(16)? as f64;
    }
    let mut scale = 1.0 / 16.0;
    for c in frac.chars() {
        v += c.to_digit(16)? as f64 * scale;
        scale /= 16.0;
    }
    Some(v * 2f64.powi(exp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn six_decimals_like_printf_when_exact_enough() {
        assert_eq!(format_f16(f16::from_f32(0.125)), "0.125000");
        assert_eq!(format_f16(f16::from_f32(-0.5)), "-0.500000");
        assert_eq!(format_f32(1.0), "1.000000");
        assert_eq!(format_f16(f16::INFINITY), "inf");
    }

    #[test]
    fn more_decimals_when_needed_and_exact_round_trip() {
        for bits in (0u16..0x7C00).step_by(7) {
            let v = f16::from_bits(bits);
            let s = format_f16(v);
            let back = f16::from_f64(parse_float(&s).unwrap());
            assert_eq!(back.to_bits(), bits, "{s}");
        }
        let tiny = 1.0e-30f32;
        assert_eq!(parse_float(&format_f32(tiny)).unwrap() as f32, tiny);
    }

    #[test]
    fn hex_floats() {
        assert_eq!(parse_float("0x1p-3"), Some(0.125));
        assert_eq!(parse_float("-0x1.8p+2"), Some(-6.0));
        assert_eq!(parse_float("0x10"), Some(16.0));
        assert_eq!(parse_float("0x1.g"), None);
        assert_eq!(parse_float("1e-5"), Some(1e-5));
        assert!(parse_float("-inf").unwrap().is_infinite());
        assert_eq!(parse_float("abc"), None);
    }
}
