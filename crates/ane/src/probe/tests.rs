use super::*;
use crate::device::{KernelIo, SimBinding, SimKernel, SimRefusal, Stage};

/// The simulator with faults: outputs bound in reverse order (what a wrong binding guess looks
/// like), or every compile refused with a given message.
#[derive(Default)]
struct Faulty {
    sim: SimDevice,
    reverse: bool,
    compile_error: Option<String>,
    outputs: usize,
}

impl Faulty {
    fn reversed() -> Faulty {
        Faulty {
            reverse: true,
            ..Faulty::default()
        }
    }
}

impl Device for Faulty {
    type Kernel = SimKernel;
    type Binding = SimBinding;
    fn name(&self) -> &str {
        "faulty"
    }
    fn compile(&mut self, unit: &CompileUnit) -> Result<SimKernel, DeviceError> {
        if let Some(m) = &self.compile_error {
            return Err(DeviceError::new("faulty", Stage::Compile, &unit.name, m));
        }
        self.sim.compile(unit)
    }
    fn io<'k>(&self, kernel: &'k SimKernel, function: &str) -> Option<&'k KernelIo> {
        self.sim.io(kernel, function)
    }
    fn bind(&mut self, kernel: &SimKernel, function: &str) -> Result<SimBinding, DeviceError> {
        self.outputs = self
            .sim
            .io(kernel, function)
            .map_or(0, |io| io.outputs.len());
        self.sim.bind(kernel, function)
    }
    fn write_input<R>(
        &mut self,
        binding: &mut SimBinding,
        index: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        self.sim.write_input(binding, index, f)
    }
    fn read_output<R>(&self, binding: &SimBinding, index: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        // Two outputs of different sizes: the reversed one is read through the other's layout,
        // truncated or zero-padded as a driver with a wrong guess would.
        let other = if self.reverse && self.outputs == 2 {
            1 - index
        } else {
            index
        };
        self.sim.read_output(binding, other, |b| {
            let mut v = b.to_vec();
            self.sim
                .read_output(binding, index, |mine| v.resize(mine.len(), 0));
            f(&v)
        })
    }
    fn evaluate(
        &mut self,
        kernel: &SimKernel,
        binding: &mut SimBinding,
        live: usize,
    ) -> Result<(), DeviceError> {
        self.sim.evaluate(kernel, binding, live)
    }
}

#[test]
fn every_question_passes_on_the_simulator_in_both_dialects() {
    for d in MilDialect::ALL {
        let (cases, skipped) = questions::cases(d).unwrap();
        assert!(cases.iter().any(|c| c.name == "io.several"));
        for c in &cases {
            let r = run(&mut SimDevice::new(), c, d);
            if c.name == "state.update" {
                // The simulator has no states: on it as the device, the case fails saying so
                // (on a device that runs it, it is run and reported as not compared).
                match &r.verdict {
                    Verdict::Fail { reason, .. } => {
                        assert!(
                            reason.contains("not supported by the simulator"),
                            "{reason}"
                        )
                    }
                    v => panic!("{v:?}"),
                }
                continue;
            }
            assert_eq!(r.verdict, Verdict::Pass { rel_err: 0.0 }, "{} {d}", c.name);
            assert_eq!(r.to_json()["result"], "pass");
        }
        // Dialect B has no states: that case is skipped with the reason, not dropped.
        assert_eq!(
            skipped.iter().any(|s| s.name == "state.update"),
            d == MilDialect::B
        );
    }
}

#[test]
fn a_swapped_binding_fails_the_comparison() {
    let (cases, _) = questions::cases(MilDialect::A).unwrap();
    let several = cases.iter().find(|c| c.name == "io.several").unwrap();
    let r = run(&mut Faulty::reversed(), several, MilDialect::A);
    match &r.verdict {
        Verdict::Fail { stage, reason, .. } => {
            assert_eq!(stage, "comparing");
            assert!(reason.contains("differ from the simulator"), "{reason}");
        }
        v => panic!("{v:?}"),
    }
    // A one-output case is not affected by the order.
    let one = cases.iter().find(|c| c.name == "io.width1").unwrap();
    assert!(matches!(
        run(&mut Faulty::reversed(), one, MilDialect::A).verdict,
        Verdict::Pass { .. }
    ));
}

#[test]
fn a_refused_unit_fails_with_the_devices_reason_and_is_remembered_by_op() {
    let (cases, _) = questions::cases(MilDialect::A).unwrap();
    let fp32 = cases.iter().find(|c| c.name == "io.fp32").unwrap();
    let mut dev = SimDevice::refusing(SimRefusal {
        stage: Stage::Compile,
        unit: "fp32".into(),
    });
    let r = run(&mut dev, fp32, MilDialect::A);
    match &r.verdict {
        Verdict::Fail { stage, reason, .. } => {
            assert_eq!(stage, "compiling");
            assert!(reason.contains("refused on request"), "{reason}");
        }
        v => panic!("{v:?}"),
    }
    let mut census = r.clone();
    census.op_type = Some("abs".into());
    assert_eq!(failed_ops(&[r, census]), ["abs"]);
}

#[test]
fn inputs_are_deterministic_and_in_their_ranges() {
    let (cases, _) = questions::cases(MilDialect::A).unwrap();
    let mut c = cases.into_iter().next().unwrap();
    let a = input_values(&c, "main", 0, 64);
    assert_eq!(a, input_values(&c, "main", 0, 64));
    assert_ne!(a, input_values(&c, "main", 1, 64));
    assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
    c.positive = true;
    assert!(input_values(&c, "main", 0, 64)
        .iter()
        .all(|v| (0.5..1.5).contains(v)));
    c.integer_inputs.insert("main".into(), vec![true]);
    assert!(input_values(&c, "main", 0, 64)
        .iter()
        .all(|&v| v == 0.0 || v == 1.0));
}

#[test]
fn an_exhausted_compile_budget_is_no_answer_about_the_program() {
    let (cases, _) = questions::cases(MilDialect::A).unwrap();
    let mut dev = Faulty {
        compile_error: Some(
            "compile budget exhausted: 119 ANE compiles in this process, the limit is 119".into(),
        ),
        ..Faulty::default()
    };
    let r = run(&mut dev, &cases[0], MilDialect::A);
    match &r.verdict {
        Verdict::Skip { reason } => assert!(reason.starts_with("not asked"), "{reason}"),
        v => panic!("{v:?}"),
    }
    let mut census = r.clone();
    census.form = Some("abs(x=r4:fp16) -> r4:fp16".into());
    assert!(form_verdicts(&[census]).is_empty());
    let mut refused = Faulty {
        compile_error: Some("InvalidMILProgram".into()),
        ..Faulty::default()
    };
    assert!(matches!(
        run(&mut refused, &cases[0], MilDialect::A).verdict,
        Verdict::Fail { .. }
    ));
}
