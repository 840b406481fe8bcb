//! The op table's inference on hand-built operations.

use super::*;

#[test]
fn table_has_unique_names() {
    let mut names: Vec<_> = OPS.iter().map(|d| d.name).collect();
    names.sort_unstable();
    let n = names.len();
    names.dedup();
    assert_eq!(names.len(), n);
}

#[test]
fn broadcast_rules() {
    assert_eq!(
        broadcast(&[1, 64, 1, 8], &[1, 1, 1, 8]).unwrap(),
        vec![1, 64, 1, 8]
    );
    assert_eq!(broadcast(&[1, 64, 1, 8], &[]).unwrap(), vec![1, 64, 1, 8]);
    assert_eq!(broadcast(&[4, 1], &[3]).unwrap(), vec![4, 3]);
    assert!(broadcast(&[2, 3], &[4]).is_err());
}

#[test]
fn axis_normalisation() {
    assert_eq!(norm_axis(-1, 4).unwrap(), 3);
    assert!(norm_axis(4, 4).is_err());
    assert!(norm_axes(&[1, -3], 4).is_err());
}
