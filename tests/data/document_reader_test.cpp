#include "data/document_reader.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

TEST(DocumentReader, ReadsTheThreeDocumentFormats) {
  TemporaryDirectory dir;
  testing::write_text(dir / "a.txt", "first doc\nline two\n\n\nsecond doc\n");
  testing::write_text(dir / "b.txt", "a whole file\n");
  EXPECT_EQ(read_documents({dir / "a.txt", dir / "b.txt"}, DocumentFormat::kText),
            (std::vector<std::string>{"first doc\nline two", "second doc", "a whole file"}));
  testing::write_text(dir / "c.jsonl",
                      "{\"text\": \"one\\ntwo\", \"id\": 1}\n\n{\"text\": \"three\"}\n");
  EXPECT_EQ(read_documents({dir / "c.jsonl"}, DocumentFormat::kJsonl),
            (std::vector<std::string>{"one\ntwo", "three"}));
  testing::write_text(dir / "d", "A fortune.\n%\nAnother,\n  \x1b[33mindented\x1b[m.\n%\n");
  EXPECT_EQ(read_documents({dir / "d"}, DocumentFormat::kFortune),
            (std::vector<std::string>{"A fortune.", "Another,\n  indented."}));
}

TEST(DocumentReader, StreamsOneDocumentAtATimeAndCountsTheFilesBytes) {
  TemporaryDirectory dir;
  const std::string text = "one\n\ntwo\nlines\n\nthree";  // no newline at the very end
  testing::write_text(dir / "a.txt", text);
  testing::write_text(dir / "b.txt", "four");
  DocumentReader reader({dir / "a.txt", dir / "b.txt"}, {.format = DocumentFormat::kText});
  EXPECT_EQ(reader.next(), "one");
  EXPECT_EQ(reader.next(), "two\nlines");
  EXPECT_EQ(reader.next(), "three");
  EXPECT_EQ(reader.next(), "four");
  EXPECT_EQ(reader.next(), std::nullopt);
  EXPECT_EQ(reader.bytes_read(), static_cast<int64_t>(text.size()) + 4);
}

// A document is handed out as soon as it is read, not once the input is: through a pipe whose
// writer waits for the first document to arrive before it writes the second.
TEST(DocumentReader, HandsOutADocumentBeforeTheRestOfTheInputExists) {
  TemporaryDirectory dir;
  const auto pipe = dir / "pipe";
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0600), 0);
  std::atomic<bool> first_arrived{false};
  std::atomic<bool> waited_in_vain{false};
  std::thread writer([&] {
    std::ofstream out(pipe);
    out << "first document\n\n" << std::flush;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!first_arrived && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    waited_in_vain = !first_arrived;
    out << "second document\n";
  });
  DocumentReader reader({pipe}, {.format = DocumentFormat::kText});
  EXPECT_EQ(reader.next(), "first document");
  first_arrived = true;
  EXPECT_EQ(reader.next(), "second document");
  EXPECT_EQ(reader.next(), std::nullopt);
  writer.join();
  EXPECT_FALSE(waited_in_vain) << "the first document came only once the input had ended";
}

TEST(DocumentReader, TakesTheNamedJsonlFieldAndSkipsBadLinesOnlyWhenAsked) {
  TemporaryDirectory dir;
  testing::write_text(dir / "mixed.jsonl",
                      "{\"body\": \"first\"}\n{\"text\": \"no body\"}\nnot json\n{\"body\": 3}\n"
                      "{\"body\": \"last\"}\n");
  DocumentReaderOptions options{.format = DocumentFormat::kJsonl, .text_field = "body"};
  try {
    read_documents({dir / "mixed.jsonl"}, options);
    FAIL() << "a bad line passed";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()),
                    "mixed.jsonl:2: expected a JSON object with a \"body\" string");
    EXPECT_CONTAINS(std::string(error.what()), "--skip-bad-lines");
  }
  options.skip_bad_lines = true;
  DocumentReader reader({dir / "mixed.jsonl"}, options);
  EXPECT_EQ(reader.next(), "first");
  EXPECT_EQ(reader.next(), "last");
  EXPECT_EQ(reader.next(), std::nullopt);
  EXPECT_EQ(reader.bad_lines(), 3);
}

TEST(DocumentReader, InputsAreFilesDirectoriesAndGlobs) {
  TemporaryDirectory dir;
  std::filesystem::create_directories(dir / "corpus" / "part2");
  std::filesystem::create_directories(dir / "corpus" / ".git");
  for (const char* name : {"corpus/b.txt", "corpus/a.txt", "corpus/part2/c.txt", "corpus/.hidden",
                           "corpus/.git/HEAD", "x1.txt", "x2.txt", "y.txt"})
    testing::write_text(dir / name, "text");
  const std::vector<std::filesystem::path> files = list_input_files(
      {(dir / "y.txt").string(), (dir / "corpus").string(), (dir / "x?.txt").string()});
  EXPECT_EQ(files, (std::vector<std::filesystem::path>{
                       dir / "y.txt", dir / "corpus" / "a.txt", dir / "corpus" / "b.txt",
                       dir / "corpus" / "part2" / "c.txt", dir / "x1.txt", dir / "x2.txt"}));
  EXPECT_EQ(total_input_bytes(files), 6 * 4);

  std::filesystem::create_directories(dir / "empty");
  try {
    list_input_files({(dir / "empty").string()});
    FAIL();
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "empty: no files in it or matching it");
  }
  try {
    list_input_files({(dir / "z*.txt").string()});
    FAIL();
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "z*.txt: no files in it or matching it");
  }
}

}  // namespace
}  // namespace mltrain
