//! Properties of the IR over random well-typed modules (see `dcir-testgen`).

use dcir_ir::{Graph, print_graph, print_module, verify_graph, verify_module};
use dcir_testgen::{arb_graph, arb_module, arb_module_spec, build_module, proptest_config};
use proptest::prelude::*;

proptest! {
    #![proptest_config(proptest_config())]

    /// Every spec builds, and the module verifies (module-level checks included).
    #[test]
    fn generated_modules_verify(specs in arb_module_spec()) {
        let module = build_module(&specs);
        prop_assert!(module.is_ok(), "{}", module.unwrap_err());
        let module = module.unwrap();
        prop_assert_eq!(verify_module(&module), Ok(()));
        for g in &module.graphs {
            prop_assert_eq!(verify_graph(g), Ok(()));
        }
    }

    /// Printing is a pure function of the module: twice, or of a clone, gives the same text.
    #[test]
    fn printing_is_deterministic(module in arb_module()) {
        let text = print_module(&module);
        prop_assert_eq!(&print_module(&module), &text);
        prop_assert_eq!(&print_module(&module.clone()), &text);
        let graphs: String = module.graphs.iter().map(print_graph).collect::<Vec<_>>().join("\n");
        prop_assert_eq!(graphs, text);
    }

    /// A graph equals its clone, and a module equals its clone.
    #[test]
    fn clones_are_equal(module in arb_module()) {
        prop_assert_eq!(&module.clone(), &module);
        for g in &module.graphs {
            let copy: Graph = g.clone();
            prop_assert!(copy == *g, "graph @{} differs from its clone", g.name());
        }
    }

    /// Verification of a clone gives the same answer (it is `Ok` for generated graphs).
    #[test]
    fn generated_graphs_verify(graph in arb_graph()) {
        prop_assert_eq!(verify_graph(&graph.clone()), Ok(()));
    }
}
