//! What one client may ask of the server: time to send its headers and body, connections held
//! at once, and the size of a request's lists. Past a limit the answer is a 4xx (a 503 for the
//! connection limit) in the API's error shape that names the limit and the flag that sets it.

use std::time::Duration;

use crate::error::ApiError;

/// The limits; [`Limits::default`] is what `anelm serve` uses unless told otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Time a client has to send a request's headers (also how long an idle connection stays).
    pub header_timeout: Duration,
    /// Time a client has to send a request's body once its headers are in.
    pub body_timeout: Duration,
    /// Open connections at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Most choices (`n`) per request.
    pub max_choices: usize,
    /// Largest `max_tokens` (`max_completion_tokens`) a request may name; below it the answer
    /// is still cut where the context ends.
    pub max_tokens: usize,
    /// Most stop strings (`stop`, `stop_sequences`) per request.
    pub max_stop: usize,
    /// Most `logit_bias` entries per request.
    pub max_logit_bias: usize,
    /// Most tools per request.
    pub max_tools: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 256,
            max_body_bytes: 4 << 20,
            max_choices: 8,
            max_tokens: 65536,
            max_stop: 16,
            max_logit_bias: 1024,
            max_tools: 128,
        }
    }
}

/// A count of field `param` against its limit; `flag` is the `serve` flag that sets it.
fn count(param: &str, n: usize, limit: usize, flag: &str) -> Result<(), ApiError> {
    if n > limit {
        return Err(ApiError::bad_param(
            param,
            format!("{param} has {n} entries, more than this server's limit of {limit} ({flag})"),
        ));
    }
    Ok(())
}

impl Limits {
    pub fn stop(&self, param: &str, n: usize) -> Result<(), ApiError> {
        count(param, n, self.max_stop, "--max-stop")
    }

    pub fn logit_bias(&self, n: usize) -> Result<(), ApiError> {
        count("logit_bias", n, self.max_logit_bias, "--max-logit-bias")
    }

    pub fn tools(&self, n: usize) -> Result<(), ApiError> {
        count("tools", n, self.max_tools, "--max-tools")
    }

    /// `n`, when given, within `1..=max_choices`.
    pub fn choices(&self, n: Option<i64>) -> Result<usize, ApiError> {
        let n = n.unwrap_or(1);
        match usize::try_from(n) {
            Ok(n) if (1..=self.max_choices).contains(&n) => Ok(n),
            _ => Err(ApiError::bad_param(
                "n",
                format!(
                    "n must be in [1, {}] on this server (--max-n), got {n}",
                    self.max_choices
                ),
            )),
        }
    }

    /// A requested `max_tokens` no larger than the server's limit.
    pub fn max_tokens(&self, param: &str, requested: Option<i64>) -> Result<(), ApiError> {
        match requested {
            Some(n) if n > 0 && n as u64 > self.max_tokens as u64 => Err(ApiError::bad_param(
                param,
                format!(
                    "{param} is {n}, more than this server's limit of {} (--max-tokens-limit)",
                    self.max_tokens
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The refusal of a body larger than [`Limits::max_body_bytes`].
    pub fn body_too_large(&self) -> String {
        format!(
            "The request body is larger than this server's limit of {} bytes (--max-body-bytes)",
            self.max_body_bytes
        )
    }

    /// The refusal of a body that did not arrive within [`Limits::body_timeout`].
    pub fn body_too_slow(&self) -> String {
        format!(
            "The request body did not arrive within this server's limit of {} s (--body-timeout)",
            self.body_timeout.as_secs_f64()
        )
    }

    /// The refusal of headers that did not arrive within [`Limits::header_timeout`].
    pub fn headers_too_slow(&self) -> String {
        format!(
            "The request headers did not arrive within this server's limit of {} s (--header-timeout)",
            self.header_timeout.as_secs_f64()
        )
    }

    /// The refusal of a connection past [`Limits::max_connections`].
    pub fn too_many_connections(&self) -> String {
        format!(
            "The server holds its limit of {} open connections (--max-connections); retry later",
            self.max_connections
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_is_named_with_its_flag() {
        let l = Limits {
            max_stop: 2,
            max_logit_bias: 3,
            max_tools: 1,
            max_choices: 4,
            max_tokens: 100,
            ..Limits::default()
        };
        assert!(l.stop("stop", 2).is_ok());
        let e = l.stop("stop_sequences", 3).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop_sequences"));
        assert!(
            e.message.contains("limit of 2 (--max-stop)"),
            "{}",
            e.message
        );
        assert!(l.logit_bias(3).is_ok());
        assert!(l
            .logit_bias(4)
            .unwrap_err()
            .message
            .contains("--max-logit-bias"));
        assert!(l.tools(2).unwrap_err().message.contains("limit of 1"));
        assert_eq!(l.choices(None).unwrap(), 1);
        assert_eq!(l.choices(Some(4)).unwrap(), 4);
        for bad in [0, -1, 5] {
            let e = l.choices(Some(bad)).unwrap_err();
            assert!(e.message.contains("[1, 4]"), "{}", e.message);
        }
        assert!(l.max_tokens("max_tokens", Some(100)).is_ok());
        assert!(l.max_tokens("max_tokens", None).is_ok());
        let e = l
            .max_tokens("max_completion_tokens", Some(101))
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_completion_tokens"));
        assert!(e.message.contains("limit of 100"), "{}", e.message);
    }
}
