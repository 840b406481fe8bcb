//! Property tests: `dequantize` accepts any bytes of the right length for every type without
//! panicking, and refuses every wrong length with an error.

use anelm_formats::quant::dequantize;
use anelm_formats::{FormatError, GgmlType};
use proptest::prelude::*;

fn any_type() -> impl Strategy<Value = GgmlType> {
    proptest::sample::select(GgmlType::ALL.to_vec())
}

/// A type with arbitrary bytes for 0..5 whole blocks of it.
fn type_and_blocks() -> impl Strategy<Value = (GgmlType, Vec<u8>)> {
    (any_type(), 0usize..5).prop_flat_map(|(t, n)| {
        (
            Just(t),
            proptest::collection::vec(any::<u8>(), n * t.block_bytes()),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_of_whole_blocks_dequantize((t, bytes) in type_and_blocks()) {
        let n = bytes.len() / t.block_bytes() * t.block_elems();
        let mut out = vec![0f32; n];
        prop_assert!(dequantize(t, &bytes, &mut out).is_ok());
    }

    #[test]
    fn wrong_lengths_are_errors(
        t in any_type(),
        n_blocks in 0usize..5,
        extra_bytes in 0usize..8,
        extra_elems in 0usize..8,
    ) {
        let n_bytes = n_blocks * t.block_bytes() + extra_bytes;
        let n_elems = n_blocks * t.block_elems() + extra_elems;
        // Extra bytes and values can still be whole blocks of each other (plain types).
        prop_assume!(t.bytes_for(n_elems) != Some(n_bytes));
        let bytes = vec![0x5au8; n_bytes];
        let mut out = vec![0f32; n_elems];
        let err = dequantize(t, &bytes, &mut out);
        let is_length_error = matches!(
            err,
            Err(FormatError::BadQuantLength { dtype, len, n }) if dtype == t && len == n_bytes && n == n_elems
        );
        prop_assert!(is_length_error, "{t}: {n_bytes} bytes for {n_elems} values gave {err:?}");
    }
}
