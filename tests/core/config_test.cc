// ConfigNode: typed access, and errors that name the file, the line and the field.
#include "core/config.h"

#include <cstdio>
#include <fstream>

#include "model/test_data.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using testing_util::error_of;

TEST(Config, ReadsTypedValuesAndDefaults) {
  const ConfigNode root = ConfigNode::parse_string("name: x\nspeed: 0.5\ncount: 3\nflag: true\nlist: [1, 2]\n", "t");
  EXPECT_EQ(root.get<std::string>("name"), "x");
  EXPECT_DOUBLE_EQ(root.get<double>("speed"), 0.5);
  EXPECT_EQ(root.get<int64_t>("count"), 3);
  EXPECT_TRUE(root.get<bool>("flag"));
  EXPECT_EQ(root.get<int64_t>("missing", 7), 7);
  EXPECT_EQ(root.at("list").items().size(), 2u);
  EXPECT_EQ(root.at("list").items()[1].field(), "list[1]");
}

TEST(Config, MalformedYamlNamesFileAndLine) {
  const std::string msg =
      error_of([] { ConfigNode::parse_string("a: 1\nb: [1, 2\nc: 3\n", "bad.yaml"); }, ErrorCode::kConfig);
  EXPECT_THAT(msg, HasSubstr("bad.yaml:"));
  EXPECT_THAT(msg, HasSubstr("YAML syntax error"));
}

TEST(Config, WrongTypeNamesFieldAndLine) {
  const ConfigNode root = ConfigNode::parse_string("chips:\n  - name: a\n    speed: fast\n", "chips.yaml");
  const std::string msg = error_of([&] { root.at("chips").items()[0].get<double>("speed"); }, ErrorCode::kConfig);
  EXPECT_THAT(msg, HasSubstr("chips.yaml:3:12"));
  EXPECT_THAT(msg, HasSubstr("field 'chips[0].speed'"));
  EXPECT_THAT(msg, HasSubstr("expected a number, got 'fast'"));
}

TEST(Config, MissingFieldIsNamed) {
  const ConfigNode root = ConfigNode::parse_string("model:\n  layers: 2\n", "m.yaml");
  const std::string msg = error_of([&] { root.at("model").get<int64_t>("hidden"); }, ErrorCode::kConfig);
  EXPECT_THAT(msg, HasSubstr("m.yaml:2:3"));
  EXPECT_THAT(msg, HasSubstr("missing required field 'hidden'"));
}

TEST(Config, UnknownKeySuggestsTheNearestOne) {
  const ConfigNode root = ConfigNode::parse_string("layers: 2\nhiden: 64\n", "m.yaml");
  const std::string msg = error_of([&] { root.allow_only({"layers", "hidden"}); }, ErrorCode::kConfig);
  EXPECT_THAT(msg, HasSubstr("m.yaml:2:1"));
  EXPECT_THAT(msg, HasSubstr("did you mean 'hidden'"));
  const std::string far = error_of([&] { root.allow_only({"layers", "vocabulary"}); }, ErrorCode::kConfig);
  EXPECT_THAT(far, HasSubstr("valid fields here: layers, vocabulary"));
  // A mapping used as a key (h2_fuzz found it ending in yaml-cpp's own exception): an error at the key.
  const ConfigNode odd = ConfigNode::parse_string("links:\n  - {between: [a, b], direct}: false\n", "c.yaml");
  EXPECT_THAT(error_of([&] { odd.at("links").items()[0].allow_only({"between"}); }, ErrorCode::kConfig),
              HasSubstr("c.yaml:2:5: field 'links[0]': a key must be a plain name, got a mapping"));
}

TEST(Config, MissingFileIsAnIoError) {
  const std::string msg = error_of([] { ConfigNode::load_file("/nonexistent/h2.yaml"); }, ErrorCode::kIo);
  EXPECT_THAT(msg, HasSubstr("/nonexistent/h2.yaml"));
}

TEST(Config, LoadsFromFile) {
  const std::string path = testing_util::temp_path("config_test.yaml");
  std::ofstream(path) << "x: 5\n";
  EXPECT_EQ(ConfigNode::load_file(path).get<int64_t>("x"), 5);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace h2
