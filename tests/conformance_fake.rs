//! The provider conformance suite for the `fake` emulator, in both screen modes.

use std::sync::Arc;

use rakazo::providers::fake::{FakeProvider, ScreenMode};
use rakazo_actors::provider::SandboxProvider;

mod multi_screen {
    use super::*;
    rakazo_actors::conformance_suite!(
        Arc::new(FakeProvider::new(ScreenMode::Multi { limit: 0 })) as Arc<dyn SandboxProvider>
    );
}

mod single_screen {
    use super::*;
    rakazo_actors::conformance_suite!(
        Arc::new(FakeProvider::new(ScreenMode::Single)) as Arc<dyn SandboxProvider>
    );
}
