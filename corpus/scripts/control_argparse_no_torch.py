"""Passing control without torch: parses its arguments, reads stdin if piped, writes to stdout."""

import argparse
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    for epoch in range(args.epochs):
        print(f"epoch {epoch}: lr={args.lr * 0.5 ** epoch:.4f}")
    print("argv:", sys.argv[1:])


if __name__ == "__main__":
    main()
