//! Programs formed from graphs (lowered and fused) print in the flow text form to a text
//! that parses back to an equal program and prints identically.

use kiln_flow::program::FlowProgram;
use kiln_flow::text::{parse_program, print_program};

fn round_trip_program(p: &FlowProgram) -> String {
    let text = print_program(p);
    let back = parse_program(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&back, p, "\n{text}");
    assert_eq!(print_program(&back), text);
    text
}

#[test]
fn programs_formed_from_graphs_round_trip() {
    // Layout ops are lowered; whatever else fails to lower is skipped here (the
    // filetests cover the other ops).
    let graphs = [
        "graph @t(%0: f32[2,3,4] \"x\") -> (%1) {
  %1 = Transpose(%0) {perm = [2, 0, 1]} : f32[4,2,3] \"y\"
}",
        "graph @r(%0: f32[2,3,4] \"x\") -> (%2, %3) {
  %1 = const i64[2] [6, 4]
  %2 = Reshape(%0, %1) : f32[6,4] \"y\"
  %3 = Transpose(%2) {perm = [1, 0]} : f32[4,6] \"z\"
}",
        "graph @c(%0: f32[2,3] \"x\") -> (%4) {
  %1 = const i64[1] [1]
  %2 = const i64[1] [3]
  %3 = Concat(%0, %0) {axis = 0} : f32[4,3]
  %4 = Slice(%3, %1, %2) : f32[2,3]
}",
    ];
    let mut formed = 0;
    for src in graphs {
        let Ok(g) = kiln_ir::text::parse(src) else { continue };
        if let Ok(p) = kiln_lower::form(&g) {
            round_trip_program(&p);
            formed += 1;
        }
    }
    assert!(formed >= 1);
}
