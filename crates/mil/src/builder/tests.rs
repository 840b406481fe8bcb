//! The builder's checks on malformed programs and its typed helpers' shapes.

use super::*;

fn fb() -> FunctionBuilder {
    FunctionBuilder::new("main", Opset::Ios18)
}

#[test]
fn conv1x1_infers_output_and_binds_named_consts() {
    let mut f = fb();
    let x = f.input("x", TensorType::fp16([1, 64, 1, 32])).unwrap();
    let w = f
        .weight(
            "w",
            TensorType::fp16([128, 64, 1, 1]),
            WeightData::f16_from_f32(&[0.0; 128 * 64]),
        )
        .unwrap();
    let y = f.name_next("y").conv1x1(x, w).unwrap();
    assert_eq!(f.type_of(y).unwrap(), &TensorType::fp16([1, 128, 1, 32]));
    let func = f.function();
    let conv = func.producer(y).unwrap();
    let names: Vec<_> = conv.inputs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "dilations",
            "groups",
            "pad",
            "pad_type",
            "strides",
            "weight",
            "x"
        ]
    );
    let Argument::Single(Binding::Value(pt)) = conv.input("pad_type").unwrap() else {
        panic!()
    };
    assert_eq!(func.name_of(*pt), "y_pad_type");
    assert_eq!(func.const_value(*pt).unwrap().as_str(), Some("valid"));
}

#[test]
fn malformed_ops_are_errors() {
    let mut f = fb();
    let x = f.input("x", TensorType::fp16([1, 64, 1, 32])).unwrap();
    let w = f
        .weight(
            "w",
            TensorType::fp16([128, 32, 1, 1]),
            WeightData::f16_from_f32(&[0.0; 128 * 32]),
        )
        .unwrap();
    let e = f.conv1x1(x, w).unwrap_err().to_string();
    assert!(e.contains("input channels"), "{e}");
    let y = f.input("y2", TensorType::fp32([1, 64, 1, 32]));
    assert!(y.is_err(), "inputs after ops are rejected");
    let z = f.reshape(x, &[1, 3, -1]).unwrap_err().to_string();
    assert!(z.contains("reshape"), "{z}");
    assert!(f.op1("no_such_op", vec![]).is_err());
    let before = (f.function().values().len(), f.function().ops().len());
    assert!(f.softmax(x, 4).is_err());
    assert_eq!(
        (f.function().values().len(), f.function().ops().len()),
        before,
        "failed calls leave no consts behind"
    );
    let y = f.softmax(x, 3).unwrap();
    assert_eq!(
        f.function().name_of(y),
        "softmax_0",
        "and no gaps in the names"
    );
}

#[test]
fn names_are_unique_and_checked() {
    let mut f = fb();
    let x = f.input("x", TensorType::fp16([1, 4])).unwrap();
    assert!(f.input("x", TensorType::fp16([1, 4])).is_err());
    assert!(f.name_next("x").relu(x).is_err());
    assert!(f.name_next("bad name").relu(x).is_err());
    let a = f.relu(x).unwrap();
    let b = f.relu(x).unwrap();
    assert_ne!(f.function().name_of(a), f.function().name_of(b));
    f.rename(b, "out").unwrap();
    assert_eq!(
        f.function().producer(b).unwrap().name.as_deref(),
        Some("out")
    );
}

#[test]
fn opset_gates_newer_ops() {
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let s = f.input("x", TensorType::fp16([1, 4])).unwrap();
    let e = f
        .op1("slice_update", vec![("x", s.into()), ("update", s.into())])
        .unwrap_err()
        .to_string();
    assert!(e.contains("ios18"), "{e}");
}

#[test]
fn split_names_extra_outputs() {
    let mut f = fb();
    let x = f.input("x", TensorType::fp16([1, 6, 1, 4])).unwrap();
    let parts = f.name_next("p").split(x, 1, 3).unwrap();
    let names: Vec<_> = parts
        .iter()
        .map(|&p| f.function().name_of(p).to_string())
        .collect();
    assert_eq!(names, ["p", "p_1", "p_2"]);
    assert_eq!(f.type_of(parts[2]).unwrap().shape, vec![1, 2, 1, 4]);
}

#[test]
fn state_round_trip_types() {
    let mut f = fb();
    let k = f
        .state_input("k_cache", TensorType::fp16([1, 8, 1, 16]))
        .unwrap();
    let x = f.input("x", TensorType::fp16([1, 8, 1, 16])).unwrap();
    assert!(f.relu(k).is_err(), "a state is not a tensor operand");
    let r = f.read_state(k).unwrap();
    let s = f.add(r, x).unwrap();
    let u = f.update_state(k, s).unwrap();
    assert!(f.output(k).is_err());
    f.output(u).unwrap();
    f.finish().unwrap();
}
