//! One tensor's place in its surface, from its live entry: the channel stride from
//! `PlaneStride`, else `RowStride`, else the `PlaneDescriptor` planes, else the proven
//! 64-byte-row layout (FACTS §4, H3) with a warning that carries the raw entry.

use super::parse::LiveTensor;
use super::{DeclaredTensor, ElemType, TensorSlot, ALIGN_16K};
use crate::error::{MacError, Result};

/// Bytes from one channel to the next when the attributes say nothing: each row padded to
/// 64 bytes, `alignUp(W · sizeof(elt), 64)` (FACTS §4, measured by H3 on M3 Ultra; the same
/// rule as `anelm_ane::device::IoLayout::ane`).
pub fn fallback_channel_stride(dtype: ElemType, width: usize) -> usize {
    (width * dtype.bytes()).div_ceil(64) * 64
}

/// Where a slot's entry came from, for messages.
pub(super) struct Entry<'a> {
    pub list: &'static str,
    pub tensor: &'a LiveTensor,
}

/// The slot of `d` bound to `symbol`. `what` is "input" or "output"; `notes` collects what had
/// to be assumed (each also logged as a warning).
pub(super) fn slot(
    what: &str,
    d: &DeclaredTensor,
    symbol: u32,
    entry: Option<Entry>,
    align_16k: bool,
    notes: &mut Vec<String>,
) -> Result<TensorSlot> {
    let bad = |m: String| MacError::Layout(format!("{what} {}: {m}", d.name));
    let row = d.width * d.dtype.bytes();
    let fallback = fallback_channel_stride(d.dtype, d.width);
    let (channel_stride, batch_stride) = match entry {
        None => {
            note(
                notes,
                format!(
                    "{what} {} (symbol {symbol}): no entry in {}; assuming 64-byte rows ({fallback} B per channel)",
                    d.name,
                    if what == "input" { "LiveInputList, LiveInputParamList or LiveStateList" } else { "LiveOutputList" }
                ),
            );
            (fallback, None)
        }
        Some(Entry { list, tensor: t }) => {
            let n = |key: &str| t.number(key).map_err(|m| bad(format!("{list} entry: {m}")));
            if let Some(ty) = t.text("Type") {
                let got = ElemType::from_ane(ty)
                    .ok_or_else(|| bad(format!("Type {ty} is not Float16 or Float32")))?;
                if got != d.dtype {
                    return Err(bad(format!(
                        "Type {ty}, but the MIL declares {:?}",
                        d.dtype
                    )));
                }
            }
            let planes = t
                .plane_row_strides()
                .map_err(|m| bad(format!("{list} entry: {m}")))?;
            let height = n("Height")?;
            // One plane whose rows are the channels: `Height` counts channels, not rows.
            let rows_are_channels = d.channels > 1
                && planes.as_ref().is_some_and(|p| p.len() == 1)
                && height == Some(d.channels as u64);
            let expect = |field: &str, got: Option<u64>, want: usize| match got {
                Some(g) if g != want as u64 => {
                    Err(bad(format!("{field} {g}, but the MIL declares {want}")))
                }
                _ => Ok(()),
            };
            expect("Channels", n("Channels")?, d.channels)?;
            expect("Width", n("Width")?, d.width)?;
            if !rows_are_channels {
                expect("Height", height, 1)?;
            }
            expect("Batches", n("Batches")?, 1)?;
            expect("Depth", n("Depth")?, 1)?;
            expect("Interleave", n("Interleave")?, 1)?;
            // Zero means "not given" (the MUL check of parse.rs's sources does the same).
            let plane = n("PlaneStride")?.filter(|&p| p > 0);
            let row_stride = n("RowStride")?.filter(|&r| r > 0);
            let stride = if let Some(p) = plane {
                if (p as usize) < row {
                    return Err(bad(format!(
                        "PlaneStride {p} is less than a row of {} {:?} values ({row} bytes)",
                        d.width, d.dtype
                    )));
                }
                if let Some(r) = row_stride.filter(|&r| (r as usize) < row || r > p) {
                    return Err(bad(format!(
                        "RowStride {r} does not fit between a row ({row} bytes) and PlaneStride {p}"
                    )));
                }
                p as usize
            } else if let Some(r) = row_stride {
                // [1, C, 1, W]: a plane is one row.
                r as usize
            } else if let Some(p) = planes {
                let first = p[0];
                if p.iter().any(|&r| r != first) {
                    return Err(bad(format!(
                        "PlaneDescriptor RowStrides {p:?} differ; one stride per tensor expected"
                    )));
                }
                if !(rows_are_channels || p.len() == d.channels) {
                    return Err(bad(format!(
                        "PlaneDescriptor has {} planes (Height {}), which does not describe {} channels",
                        p.len(),
                        height.map_or("absent".into(), |h| h.to_string()),
                        d.channels
                    )));
                }
                first as usize
            } else {
                note(
                    notes,
                    format!(
                        "{what} {} (symbol {symbol}, {list}): no PlaneStride, RowStride or PlaneDescriptor; assuming 64-byte rows ({fallback} B per channel); entry: {}",
                        d.name,
                        t.raw()
                    ),
                );
                fallback
            };
            (stride, n("BatchStride")?.filter(|&b| b > 0))
        }
    };
    if channel_stride < row {
        return Err(bad(format!(
            "channel stride {channel_stride} is less than a row of {} {:?} values ({row} bytes)",
            d.width, d.dtype
        )));
    }
    let min = d.channels * channel_stride;
    let bytes = match batch_stride {
        Some(b) if (b as usize) < min => {
            return Err(bad(format!(
                "BatchStride {b} is less than Channels × stride = {min}"
            )))
        }
        Some(b) => b as usize,
        None => min,
    };
    let bytes = if align_16k {
        bytes.div_ceil(ALIGN_16K) * ALIGN_16K
    } else {
        bytes
    };
    Ok(TensorSlot {
        name: d.name.clone(),
        symbol,
        dtype: d.dtype,
        channels: d.channels,
        width: d.width,
        channel_stride,
        bytes,
    })
}

/// Records an assumption and logs it as one warning line.
pub(super) fn note(notes: &mut Vec<String>, line: String) {
    tracing::warn!("modelAttributes: {line}");
    notes.push(line);
}
