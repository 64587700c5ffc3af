"""The ground floor: small helpers over torch.fx and torch's op objects that every other
package may use, and that use nothing of fxpass above them."""
