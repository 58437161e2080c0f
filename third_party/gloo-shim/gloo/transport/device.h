#pragma once
// Shim (see gloo/README.md): opaque transport types, only ever held via smart pointers.
namespace gloo {
namespace transport {
class Device;
class Pair;
class UnboundBuffer;
} // namespace transport
} // namespace gloo
