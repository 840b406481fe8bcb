//! Which integer weight forms a machine takes: what `probe --all` saw pass or fail there, else a
//! per-chip table of what public programs ran (cited), else — off a Mac — every form.
//!
//! No hardware-proven public program uses sub-8-bit weights and one report has Apple's own tool
//! fail on blockwise int4 (FACTS §5), while int8 blockwise ran on M3 Ultra and M5 Pro: so on a
//! Mac `auto` holds 4-bit blocks in int8 containers (still the file's exact integers) until the
//! probe has seen the 4-bit form pass on that machine.

/// Per form, `None` when the machine takes it, else why not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Forms {
    /// int4/uint4 data in `constexpr_blockwise_shift_scale`.
    pub int4: Option<&'static str>,
    /// `constexpr_lut_to_dense` palettes.
    pub lut: Option<&'static str>,
    /// int8 data in `constexpr_blockwise_shift_scale` (every integer form of dialect A).
    pub int8: Option<&'static str>,
    /// `constexpr_affine_dequantize` (dialect B's int8).
    pub affine: Option<&'static str>,
}

/// What public programs ran, by chip (FACTS §5, C5).
struct ChipFact {
    /// Matched against the machine's chip name (`Apple M3 Max`).
    chip: &'static str,
    affine: Option<&'static str>,
}

const CHIPS: &[ChipFact] = &[ChipFact {
    chip: "M3 Max",
    affine: Some(
        "constexpr_affine_dequantize failed to compile on an M3 Max (ESP blog, FACTS §5 C5)",
    ),
}];

const SUB_BYTE: &str = "no hardware-proven program uses sub-8-bit weights and Apple's own tool \
                        fails on blockwise int4 (coreai-models #205, FACTS §5); int8 blocks ran \
                        on M3 Ultra and M5 Pro — `anelm probe --all` on this machine settles it";

const FAILED_INT4: &str =
    "`anelm probe --all` saw blockwise weights with 4-bit data fail on this machine";
const FAILED_INT8: &str =
    "`anelm probe --all` saw blockwise weights with int8 data fail on this machine";
const FAILED_LUT: &str = "`anelm probe --all` saw palettised weights fail on this machine";
const FAILED_AFFINE: &str =
    "`anelm probe --all` saw constexpr_affine_dequantize weights fail on this machine";

/// A probe answer about one census form: its key and whether it passed.
pub type FormVerdict<'a> = (&'a str, bool);

/// Which census forms exercise a weight form (`weight=<op>:<data type>` in the form's key).
fn uses(key: &str, op: &str, dtypes: &[&str]) -> bool {
    dtypes.iter().any(|d| key.contains(&format!("={op}:{d}")))
}

impl Forms {
    /// Every form (the simulator, or compiling off a Mac).
    pub fn all() -> Forms {
        Forms::default()
    }

    /// The forms of a machine with chip `chip` (None: not a Mac), given what the probe saw
    /// there (`verdicts` of census forms; empty when it never ran).
    pub fn for_machine(chip: Option<&str>, verdicts: &[FormVerdict]) -> Forms {
        let Some(chip) = chip else {
            return Self::from_verdicts(Forms::all(), verdicts);
        };
        let fact = CHIPS.iter().find(|f| chip.contains(f.chip));
        let table = Forms {
            int4: Some(SUB_BYTE),
            lut: Some(SUB_BYTE),
            int8: None,
            affine: fact.and_then(|f| f.affine),
        };
        Self::from_verdicts(table, verdicts)
    }

    /// `base` with the probe's answers applied: a passing form is allowed, a failing one not.
    fn from_verdicts(mut base: Forms, verdicts: &[FormVerdict]) -> Forms {
        let apply = |slot: &mut Option<&'static str>, op: &str, dtypes: &[&str], why| {
            let seen: Vec<bool> = verdicts
                .iter()
                .filter(|(k, _)| uses(k, op, dtypes))
                .map(|&(_, ok)| ok)
                .collect();
            if seen.iter().any(|ok| !ok) {
                *slot = Some(why);
            } else if !seen.is_empty() {
                *slot = None;
            }
        };
        let bw = "constexpr_blockwise_shift_scale";
        apply(&mut base.int4, bw, &["int4", "uint4"], FAILED_INT4);
        apply(&mut base.int8, bw, &["int8", "uint8"], FAILED_INT8);
        apply(
            &mut base.lut,
            "constexpr_lut_to_dense",
            &["uint4"],
            FAILED_LUT,
        );
        let affine = "constexpr_affine_dequantize";
        apply(&mut base.affine, affine, &["uint8", "int8"], FAILED_AFFINE);
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INT4: &str = "conv(weight=constexpr_blockwise_shift_scale:uint4, x=r4:fp16) -> r4:fp16";
    const INT8: &str = "conv(weight=constexpr_blockwise_shift_scale:int8, x=r4:fp16) -> r4:fp16";

    #[test]
    fn off_a_mac_everything_is_allowed() {
        assert_eq!(Forms::for_machine(None, &[]), Forms::all());
    }

    #[test]
    fn a_mac_holds_4_bit_blocks_as_int8_until_the_probe_says_otherwise() {
        let f = Forms::for_machine(Some("Apple M4"), &[]);
        assert!(f.int4.unwrap().contains("#205"));
        assert!(f.lut.is_some() && f.int8.is_none() && f.affine.is_none());
        let probed = Forms::for_machine(Some("Apple M4"), &[(INT4, true), (INT8, true)]);
        assert!(probed.int4.is_none() && probed.int8.is_none());
        let failed = Forms::for_machine(Some("Apple M4"), &[(INT4, true), (INT8, false)]);
        assert!(failed.int8.unwrap().contains("probe --all"));
        // A failure anywhere wins over a pass of the same weight form in another op.
        let mixed = Forms::for_machine(Some("Apple M4"), &[(INT4, true), (INT4, false)]);
        assert!(mixed.int4.is_some());
    }

    #[test]
    fn the_chip_table_is_per_chip() {
        let m3 = Forms::for_machine(Some("Apple M3 Max"), &[]);
        assert!(m3.affine.unwrap().contains("M3 Max"));
        assert!(Forms::for_machine(Some("Apple M3 Ultra"), &[])
            .affine
            .is_none());
        // The probe overrides the table.
        let key = "conv(weight=constexpr_affine_dequantize:uint8, x=r4:fp16) -> r4:fp16";
        assert!(Forms::for_machine(Some("Apple M3 Max"), &[(key, true)])
            .affine
            .is_none());
        // Off a Mac, what the simulator probe saw fail still counts.
        assert!(Forms::for_machine(None, &[(INT8, false)]).int8.is_some());
    }
}
