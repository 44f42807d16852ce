//! What the router decided for one token: the type the model produces and the expert store
//! observes. It lives below both (`model` and `experts` import it; it imports neither), so the
//! dependency between them points one way: the model asks the store for experts.

/// The experts chosen for one token and their mixing weights.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routing {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}
