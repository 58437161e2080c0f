#pragma once
// Shim (see gloo/README.md).
#include "gloo/context.h"
