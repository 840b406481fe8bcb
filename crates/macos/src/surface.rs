//! The IOSurface creation dictionary every project uses for ANE I/O (FACTS §3.4): one row of
//! `bytes` one-byte elements, pixel format 0.

/// The `kIOSurface*` property keys the creation dictionary sets, by their constant names.
pub const PROPERTY_KEYS: [&str; 6] = [
    "kIOSurfaceWidth",
    "kIOSurfaceHeight",
    "kIOSurfaceBytesPerElement",
    "kIOSurfaceBytesPerRow",
    "kIOSurfaceAllocSize",
    "kIOSurfacePixelFormat",
];

/// The values of [`PROPERTY_KEYS`] for a surface of `bytes` bytes.
pub fn property_values(bytes: usize) -> [i64; 6] {
    let b = bytes as i64;
    [b, 1, 1, b, b, 0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_of_bytes() {
        let props: Vec<(&str, i64)> = PROPERTY_KEYS
            .iter()
            .copied()
            .zip(property_values(4096))
            .collect();
        assert_eq!(
            props,
            [
                ("kIOSurfaceWidth", 4096),
                ("kIOSurfaceHeight", 1),
                ("kIOSurfaceBytesPerElement", 1),
                ("kIOSurfaceBytesPerRow", 4096),
                ("kIOSurfaceAllocSize", 4096),
                ("kIOSurfacePixelFormat", 0)
            ]
        );
    }
}
